"""Step times while a trial runs: the worker appends, the tuner reads.

training_harness.launch.local sets HARNESS_PROGRESS_FILE for a trial when asked to; rank 0 then
records one line per measured step ("<step> <seconds>"). Inside the measured window
that is only an append to a buffer: a thread of its own writes the buffer to the file
every FLUSH_INTERVAL_S, and `close` (after the window) writes the rest, so the steps'
own thread opens and writes no file between the window's ends (on a CPU the steps'
marks are contiguous, so a write there counted in the next step's time). The tuner
reads the file while it waits, to stop a trial that is clearly slower than the best
so far.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from pathlib import Path

STEP_LOG_ENV = "HARNESS_PROGRESS_FILE"


FLUSH_INTERVAL_S = 0.5  # how often the writer's thread appends the buffered lines


def _append(path: str, text: str) -> None:
    # progress is a courtesy; the trial goes on
    with contextlib.suppress(OSError), open(path, "a") as f:
        f.write(text)


class StepWriter:
    """`writer(step, seconds)` buffers one measured step's line (a deque append, no
    I/O); a daemon thread writes the buffer every `interval_s`; `close` writes the rest
    and stops the thread."""

    def __init__(self, path: str, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.path, self.interval_s = path, interval_s
        self._lines: deque[str] = deque()
        self._lock = threading.Lock()  # one flush at a time: the lines stay in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-log", daemon=True)
        self._thread.start()

    def __call__(self, step: int, seconds: float) -> None:
        self._lines.append(f"{step} {seconds!r}\n")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            out = []
            while self._lines:
                out.append(self._lines.popleft())
            if out:
                _append(self.path, "".join(out))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()


def step_writer(rank: int) -> StepWriter | None:
    """A writer that records measured steps (see StepWriter); None where nobody listens."""
    path = os.environ.get(STEP_LOG_ENV)
    if not path or rank != 0:
        return None
    return StepWriter(path)


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
            with contextlib.suppress(ValueError):
                times.append(float(parts[1]))
    return times
