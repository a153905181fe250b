"""Stopping a running trial that is clearly slower than the best so far (docs/tuning.md,
"Early stopping"); `SlowTrialStop` is a launcher's `should_stop`. A factor of 2 by
default: on a shared CPU repeats of one configuration differ by tens of percent.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from training_harness.records.step_log import read_steps


@dataclass
class SlowTrialStop:
    """Reads the step times rank 0 appends to `steps_file`, reports each to Optuna, and
    after `min_steps` stops a trial whose median is below the best's / `slower_than`."""

    steps_file: Path
    batch_size: int
    best: tuple[float, str] | None  # (samples/s, trial id) of the best so far
    slower_than: float
    min_steps: int
    report: Callable[[float, int], None] | None  # Optuna's trial.report; None: not reported
    on_step: Callable[[int], None]
    busy: Callable[[], bool]  # others competing: slowness is not the trial's
    seen: int = 0

    def __call__(self) -> str | None:
        times = read_steps(self.steps_file)
        if len(times) == self.seen:
            return None
        for step in range(self.seen, len(times)):
            if self.report is not None and times[step] > 0:
                self.report(self.batch_size / times[step], step)
        self.seen = len(times)
        self.on_step(self.seen)
        if not self.best or not self.slower_than or len(times) < self.min_steps:
            return None
        rate = self.batch_size / statistics.median(times)
        best_rate, best_id = self.best
        if rate * self.slower_than >= best_rate or self.busy():
            return None  # busy: measured to the end, its record flagged, measured again
        return (f"stopped early after {len(times)} steps: {rate:.4g} samples/s (median) "
                f"< 1/{self.slower_than:g} of the best so far, {best_rate:.4g} samples/s "
                f"(trial {best_id})")
