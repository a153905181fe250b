"""Where `harness bench`'s wall clock goes, phase by phase (`--verbose`, and the record's
`metrics.phases_s`).

The phases follow one another, so their seconds and the measured window add up to
the command's wall clock, less the interpreter's exit (after the record):

    python      the interpreter's start and the command line's imports (only when run
                as a command: `main()` with no argv)
    cli         parsing the flags
    plan        reading the plan file
    check       the plan against the device and the registry, its workload loaded
    peaks       the peak FLOP/s MFU divides by (the cache, or a calibration on a miss)
    flops       the model's FLOPs per sample
    estimate    the estimator's prediction
    env         the environment the record carries
    helper      the torch-side helper that prepared the plan (a fork of the rank server):
                its start, waiting for the server's imports, its answer sent back
    launch      the trial's files written, its ranks forked, then reaped and their
                record read
    start       the rank's process, from its start to its trial (imports where it was
                not forked, the workload, the process group)   (the rank's own)
    setup       the model built and the strategies composed     (the rank's own)
    warmup      the warm-up steps                               (the rank's own)
    (the measured window: metrics.window.seconds, not repeated here)
    finish      the window's losses read and the figures combined (the rank's own)
    time_to_target  with a plan's [target]: the steps to it, from the cache or trained
                (the rank's own)
    record      the record completed, the tables printed        (--verbose only)
"""

from __future__ import annotations

import time
from typing import Any

RANK_PHASES = ("start", "setup", "warmup", "finish", "time_to_target")


class BenchPhases:
    """The bench process's phases, in order, each the seconds since the one before."""

    def __init__(self, python_s: float | None = None, since: float | None = None) -> None:
        self.seconds: dict[str, float] = {}
        if python_s is not None:
            self.seconds["python"] = python_s
        self.t = time.monotonic() if since is None else since

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now

    def add(self, measured: dict[str, float], rest: str) -> None:
        """Phases measured elsewhere (a fork) since the last lap; what they leave of the
        time since then goes to `rest`."""
        now = time.monotonic()
        known = {k: float(v) for k, v in measured.items() if v is not None}
        self.seconds.update(known)
        self.seconds[rest] = max(0.0, now - self.t - sum(known.values()))
        self.t = now

    def launched(self, metrics: dict[str, Any]) -> dict[str, float]:
        """After the launch (a lap since the phase before it): the rank's phases from
        its record, and `launch`, the launcher's share, is what they and the window
        leave of it. Returns the record's phases_s: the bench's, then the rank's."""
        now = time.monotonic()
        rank = {k: v for k, v in (metrics.get("phases_s") or {}).items() if v is not None}
        window = (metrics.get("window") or {}).get("seconds") or 0.0
        spent = sum(v for k, v in rank.items() if k in RANK_PHASES) + window
        self.seconds["launch"] = self.seconds.get("launch", 0.0) + max(0.0, now - self.t - spent)
        self.t = now
        return {**self.seconds, **rank}


def phases_table(phases: dict[str, float], window_s: float | None) -> str:
    """The phases, the measured window in its place, and their sum."""
    rows = []
    for name, seconds in phases.items():
        if name == "finish" and window_s is not None:
            rows.append(("(measured steps)", window_s))
        rows.append((name, seconds))
    if window_s is not None and "finish" not in phases:
        rows.append(("(measured steps)", window_s))
    total = sum(s for _, s in rows)
    steps = (window_s or 0.0) + phases.get("warmup", 0.0)
    width = max(len(n) for n, _ in rows)
    lines = [f"  {n:<{width}}  {s:7.2f} s" for n, s in rows]
    lines.append(f"  {'total':<{width}}  {total:7.2f} s, of which steps (warm-up and "
                 f"measured) {steps:.2f} s, the rest {total - steps:.2f} s "
                 "(the interpreter's exit comes after)")
    return "\n".join(lines)
