"""Timing the measured steps as one window, with each step's own time inside it.

A barrier and a synchronisation after every step would keep the steps from
overlapping: training lets the host queue step i+1 while the device still runs
step i, and techniques that cut launch overhead gain exactly there, so a per-step
synchronisation would hide what they buy. The measured steps therefore run as one
window, as nanoGPT's bench.py does: a barrier and a synchronisation before it, one
synchronisation (and barrier) after it, nothing in between. The record's
throughput comes from the window; each step's own time (for the spread, and the
tuner's progress) comes from marks at the step boundaries: CUDA events recorded
without waiting on them, read after the window; on a CPU, whose operations are
synchronous, perf_counter.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from training_harness.core.device import synchronize


class WindowTimer:
    """The measured steps' window on `device`: `start`, `step_done` after each step, `finish`.

    `barrier` (distributed trials) runs at both ends, so the ranks start the window
    together; inside it each rank times its own steps. `completed` hands out the
    steps that have ended so far without waiting for the device, for progress.
    """

    def __init__(self, device: torch.device, barrier: Callable[[], None] | None = None):
        self.device = device
        self.barrier = barrier
        self.cuda = device.type == "cuda"
        self.source = "CUDA events" if self.cuda else "perf_counter"
        self._marks: list = []  # the window's start, then the end of each step
        self._reported = 0  # steps already handed out by `completed`
        self.times_s: list[float] = []  # each step's seconds, after `finish`
        self.window_s: float | None = None  # first step's start to last step's end

    @property
    def steps(self) -> int:
        return max(len(self._marks) - 1, 0)

    def start(self) -> None:
        if self.barrier is not None:
            self.barrier()
        synchronize(self.device)  # the device idle: the window times only its steps
        self._marks = [self._mark()]
        self._reported = 0

    def step_done(self) -> None:
        """Mark the end of a step (and the start of the next): no waiting."""
        self._marks.append(self._mark())

    def completed(self) -> list[tuple[int, float]]:
        """(step in the window, seconds) of the steps ended since the last call.

        On CUDA a step has ended when its end event has (Event.query does not
        block), so this lags the host a little but never synchronises.
        """
        done = []
        while self._reported < self.steps:
            i = self._reported
            if self.cuda and not self._marks[i + 1].query():
                break
            done.append((i, self._seconds(i, i + 1)))
            self._reported += 1
        return done

    def finish(self) -> None:
        """Wait for the window's steps, then read every step's time and the window's."""
        synchronize(self.device)
        if self.barrier is not None:
            self.barrier()
        n = self.steps
        self.times_s = [self._seconds(i, i + 1) for i in range(n)]
        self.window_s = self._seconds(0, n) if n else None

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def _seconds(self, a: int, b: int) -> float:
        start, end = self._marks[a], self._marks[b]
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


SETTLE_STEPS = 3  # warm-up has settled when its last 3 step times are
SETTLE_TOLERANCE = 0.05  # within 5% of each other (clocks ramped up, caches warm)


def settled(times_s: list[float], n: int = SETTLE_STEPS, tolerance: float = SETTLE_TOLERANCE
            ) -> bool:
    """Whether the last `n` step times are within `tolerance` of each other."""
    last = times_s[-n:]
    return len(last) == n and min(last) > 0 and (max(last) - min(last)) / min(last) <= tolerance


def warm_up(step: Callable[[int], bool], warmup_steps: int, cap: int,
            agree: Callable[[bool], bool] = lambda mine: mine,
            clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], bool | None]:
    """Run warm-up steps (`step(i)` runs step i, synchronised, and says whether to go on):
    `warmup_steps`, then on until the step times settle (`agree` makes the ranks decide
    together), `cap` at most. Returns each step's seconds and whether they settled (None
    where no step beyond `warmup_steps` was allowed)."""
    times: list[float] = []
    is_settled: bool | None = None
    for i in range(cap):
        if i >= warmup_steps:
            if cap == warmup_steps:
                break
            is_settled = agree(settled(times))
            if is_settled:
                break
        t0 = clock()
        go_on = step(i)
        times.append(clock() - t0)
        if not go_on:
            return times, is_settled
    if cap > warmup_steps and len(times) == cap:
        is_settled = agree(settled(times))
    return times, is_settled


def step_time_stats(times_s: list[float]) -> dict[str, float | int]:
    """Median with p10/p90 and n (the record's keys), plus mean/stdev/min/max."""
    if not times_s:
        raise ValueError("no measured steps")
    ordered = sorted(times_s)
    # deciles interpolated between closest ranks (numpy's default); one step is every decile
    deciles = (statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1
               else ordered * 9)
    return {
        "median": statistics.median(ordered),
        "p10": deciles[0],
        "p90": deciles[-1],
        "n": len(ordered),
        "mean": statistics.fmean(ordered),
        "stdev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "min": ordered[0],
        "max": ordered[-1],
    }
