"""selftest.json in the out folder: the device, each run of the command (with where
each of its phases got: waiting, running, done or stopped), and what each phase ran
(its steps, what it skipped and why). A later run into the same folder with
`--only` replaces the phases it runs and keeps the others, so the page written at its
end covers every phase run so far.

    {"device": {...}, "rehearsal": bool,
     "runs": [{"command", "started_at", "wall_s", "phases", "progress": {phase: ...}}],
     "phases": {"tests": {"runs": [...]}, "bench": {"plans": [...]}, "tune": {...},
                "table": {...}}}
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from training_harness.selftest.figures import read_json

FILE = "selftest.json"


def load(out: Path) -> dict[str, Any]:
    data = read_json(out / FILE) or {}
    data.setdefault("runs", [])
    data.setdefault("phases", {})
    return data


def save(out: Path, state: dict[str, Any]) -> Path:
    """Write atomically: a run stopped midway leaves the last whole state."""
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".selftest-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=2)
            f.write("\n")
        os.replace(tmp, out / FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / FILE
