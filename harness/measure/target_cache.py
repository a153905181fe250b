"""Steps to target, kept: one entry per maths key and seed (harness.core.target.maths_key).

The file is $HARNESS_CACHE_DIR/steps_to_target.json (the folder the peak calibration
uses): every study and bench on this machine shares it, so a configuration whose maths
an earlier run already trained (another layout, micro-batch, checkpointing, ZeRO,
pipeline, kernels) is not trained again. Written atomically; re-read before each write
so that workers adding entries at once keep each other's.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.measure.peak_calibration import cache_dir

CACHE_FILE = "steps_to_target.json"
_VERSION = 1


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    return data.get("entries") if isinstance(data.get("entries"), dict) else {}


def lookup(key: str) -> dict[str, Any] | None:
    return _read(cache_path()).get(key)


def store(key: str, run: dict[str, Any]) -> None:
    """Add one run; a cache that cannot be written is skipped (the record keeps the run)."""
    path = cache_path()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path)
        entries[key] = run
        fd, tmp = tempfile.mkstemp(prefix=".steps.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": _VERSION, "entries": entries}, f, sort_keys=True)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
