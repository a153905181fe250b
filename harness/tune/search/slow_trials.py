"""Stopping a running trial that is clearly slower than the best so far.

While a trial runs, its rank 0 appends each measured step's time to a file
(harness.records.step_log). `SlowTrialStop` is the launcher's `should_stop`: it reads
the new steps, reports each step's throughput to Optuna as an intermediate value
(single-objective studies), and once `min_steps` are in, stops the trial when the
median throughput so far is below the best completed trial's divided by
`slower_than`, unless other processes were competing for the machine meanwhile
(`busy`, harness.tune.search.busy_machine.BusyWatch): then it runs to the end, and its flagged
record is measured again. A factor of 2 by default: on a shared CPU the spread between
repeats of one configuration is tens of percent, so only a clear loss is cut.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from harness.records.step_log import read_steps


class SlowTrialStop:
    def __init__(
        self,
        steps_file: Path,
        batch_size: int,
        best: tuple[float, str] | None,  # (samples/s, trial id) of the best so far
        slower_than: float,
        min_steps: int,
        report: Callable[[float, int], None] | None = None,
        on_step: Callable[[int], None] | None = None,
        busy: Callable[[], bool] | None = None,
    ):
        self.steps_file = steps_file
        self.batch_size = batch_size
        self.best = best
        self.slower_than = slower_than
        self.min_steps = min_steps
        self.report = report
        self.on_step = on_step
        self.busy = busy  # others competing for the machine: slowness is not the trial's
        self.seen = 0

    def __call__(self) -> str | None:
        times = read_steps(self.steps_file)
        if len(times) == self.seen:
            return None
        for step in range(self.seen, len(times)):
            if self.report is not None and times[step] > 0:
                self.report(self.batch_size / times[step], step)
        self.seen = len(times)
        if self.on_step is not None:
            self.on_step(self.seen)
        return self.verdict(times)

    def verdict(self, times: list[float]) -> str | None:
        if not self.best or not self.slower_than or len(times) < self.min_steps:
            return None
        rate = self.batch_size / statistics.median(times)
        best_rate, best_id = self.best
        if rate * self.slower_than < best_rate:
            if self.busy is not None and self.busy():
                return None  # measured to the end: its record is flagged, measured again
            return (f"stopped early after {len(times)} steps: {rate:.4g} samples/s (median) "
                    f"< 1/{self.slower_than:g} of the best so far, {best_rate:.4g} samples/s "
                    f"(trial {best_id})")
        return None
