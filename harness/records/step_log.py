"""Step times while a trial runs: the worker appends, the tuner reads.

harness.launch.local sets HARNESS_PROGRESS_FILE for a trial when asked to; rank 0 then
appends one line per measured step ("<step> <seconds>") after the step's timing
has ended, so writing it costs the measurement nothing. The tuner reads the file
while it waits, to stop a trial that is clearly slower than the best so far.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

STEP_LOG_ENV = "HARNESS_PROGRESS_FILE"


def step_writer(rank: int) -> Callable[[int, float], None] | None:
    """A function that records one measured step; None where nobody listens."""
    path = os.environ.get(STEP_LOG_ENV)
    if not path or rank != 0:
        return None

    def write(step: int, seconds: float) -> None:
        try:
            with open(path, "a") as f:
                f.write(f"{step} {seconds!r}\n")
        except OSError:
            pass  # progress is a courtesy; the trial goes on

    return write


def read_steps(path: str | Path) -> list[float]:
    """Step times written so far (a line cut short by a concurrent write is skipped)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    times = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                times.append(float(parts[1]))
            except ValueError:
                continue
    return times
