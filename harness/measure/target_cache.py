"""Steps to target, kept: one entry per maths key and seed (training_harness.core.target.maths_key).

The file is steps_to_target.json in the per-machine cache (training_harness.measure.cache):
every study and bench on this machine shares it, so a configuration whose maths
an earlier run already trained (another layout, micro-batch, checkpointing, ZeRO,
pipeline, kernels) is not trained again.
"""

from __future__ import annotations

from typing import Any

from training_harness.measure import cache

CACHE_FILE = "steps_to_target.json"


def lookup(key: str) -> dict[str, Any] | None:
    return cache.read(CACHE_FILE).get(key)


def store(key: str, run: dict[str, Any]) -> None:
    """Add one run; a cache that cannot be written is skipped (the record keeps the run)."""
    cache.add(CACHE_FILE, {key: run})
