"""The per-machine cache: small JSON files of entries by key, in one folder.

The measured peaks (peaks.json), the device overheads (overhead.json) and the steps
to a target (steps_to_target.json) are measured once per machine and shared by
every study and bench on it. Writes are atomic (a temporary file, then a rename);
callers re-read before they write, so that processes adding entries at once keep
each other's. An absent, unreadable or corrupt file counts as empty, and a cache
that cannot be written is skipped: the figures are measured again next time.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from training_harness.records.run_store import write_atomic

_VERSION = 1


def cache_dir() -> Path:
    """$HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/training-harness, else ~/.cache/training-harness."""
    if env := os.environ.get("HARNESS_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "training-harness"


def read(name: str) -> dict[str, Any]:
    """The entries of the cache file `name`; {} when absent, unreadable or corrupt."""
    try:
        data = json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def write(name: str, entries: dict[str, Any]) -> None:
    """Replace the cache file `name`'s entries, atomically; skipped when it cannot be written."""
    with contextlib.suppress(OSError):
        write_atomic(cache_dir() / name, json.dumps({"version": _VERSION, "entries": entries},
                                                    indent=1, sort_keys=True))


def add(name: str, new: dict[str, Any]) -> None:
    """Add `new` entries to the cache file `name` (re-read first: another process may have
    added some meanwhile)."""
    write(name, {**read(name), **new})
