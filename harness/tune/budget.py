"""The study's clock and its memory budget.

One rule ends the search, for every worker: a search trial starts while the time
left is more than what the final phases are expected to need (the reserve,
training_harness.tune.final.time_reserve), and only when the corrected estimator expects it
to end in time (MARGIN: 25% for the spread of trial times). The reserve is at most
`reserve_cap_s`, budget.ablation_share of the main worker's budget; helper workers
get the main worker's clock (--deadline-at, --search-until), so all keep the same.
A running trial is stopped at the deadline (its launch timeout is the smaller of
its own timeout and the time left).

Times are wall-clock seconds since the epoch, so several workers can share them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from training_harness.study.study_file import memory_spec


@dataclass
class Clock:
    started: float  # time.time() when the study (this session) began
    search_end: float  # the deadline less the reserve's cap (budget.ablation_share)
    deadline: float  # nothing runs after this

    @classmethod
    def start(cls, budget_s: float, ablation_share: float, now: float | None = None) -> Clock:
        now = time.time() if now is None else now
        return cls(now, now + budget_s * (1 - ablation_share), now + budget_s)

    @property
    def budget_s(self) -> float:
        return self.deadline - self.started

    def left(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)

    def search_left(self, now: float | None = None) -> float:
        """Seconds until the reserve's cap begins (the search may go on past it)."""
        return self.search_end - (time.time() if now is None else now)

    @property
    def reserve_cap_s(self) -> float:
        """The most the final phases may keep of the time left."""
        return self.deadline - self.search_end

    def elapsed(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.started


MARGIN = 1.25  # a trial starts only if 1.25x its expected duration fits in the time left


def fits(expected_s: float, left_s: float) -> bool:
    """Whether a trial expected to take `expected_s` may start with `left_s` left."""
    return expected_s * MARGIN <= left_s


def launch_timeout(trial_timeout_s: float, left_s: float) -> float:
    """A trial's hard limit: its own timeout, or the deadline when that comes first."""
    return max(0.1, min(trial_timeout_s, left_s))


def memory_budget_bytes(value: str | float, device_memory_bytes: int) -> int:
    """`value` as bytes per device: a size, or a fraction of the device's memory
    (`device_memory_bytes`, from the study's facts: training_harness.study.machine_facts)."""
    kind, number = memory_spec(value)
    return int(number * device_memory_bytes) if kind == "fraction" else int(number)
