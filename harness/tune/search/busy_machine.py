"""A trial measured while the machine was busy is measured again once it is quiet.

Each record says whether other processes competed with its measured steps
(metrics.interference, harness.core.interference). A flagged figure is the busy
machine's, not the configuration's: the tuner waits for the machine to be quiet
(others below QUIET_CPU_SHARE of the CPUs, sampled every POLL_S, this tuner and its
children left out), at most a bounded wait, then runs the trial once more under the
same id. The record kept is the second; its tags keep the first figure. If the
second is flagged too, the record stays flagged: Optuna is told FAIL (never the
best, never the bar that prunes others: harness.tune.search.sampling), and the sampler may
propose the configuration again later.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from harness.core.interference import (
    QUIET_CPU_SHARE,
    cpus,
    machine_share_of_others,
    shares,
    snapshot,
)
from harness.core.units import format_seconds
from harness.records.predicates import busy_note
from harness.records.result import TrialResult

POLL_S = 2.0
MAX_WAIT_S = 60.0  # the longest wait for quiet before measuring again anyway
MAX_WAIT_SHARE = 0.05  # ... and at most this share of the study's budget


def ours() -> list[int]:
    """This tuner and every process under it (its helper, the rank server, workers)."""
    me = psutil.Process(os.getpid())
    try:
        return [me.pid, *(p.pid for p in me.children(recursive=True))]
    except psutil.Error:
        return [me.pid]


def wait_for_quiet(max_wait_s: float,
                   sample: Callable[[float], float] | None = None) -> tuple[bool, float, float]:
    """Wait until others use less than QUIET_CPU_SHARE of the CPUs, or `max_wait_s`.
    Returns (quiet, seconds waited, others' last share)."""
    sample = sample or (lambda s: machine_share_of_others(s, ours))
    t0 = time.monotonic()
    share = 1.0
    while True:
        share = sample(min(POLL_S, max(max_wait_s, 0.1)))
        waited = time.monotonic() - t0
        if share < QUIET_CPU_SHARE:
            return True, waited, share
        if waited >= max_wait_s:
            return False, waited, share


def measure_again_if_busy(result: TrialResult, run_again: Callable[[], TrialResult],
                          budget_s: float, left_s: float, say: Callable[[str], None],
                          wait: Callable[[float], tuple[bool, float, float]] | None = None,
                          ) -> TrialResult:
    """`result`, or when it was measured on a busy machine, the trial run again once
    the machine is quiet (or after the bounded wait), with the first figure in its tags."""
    first = result.to_dict()
    busy = busy_note(first)
    if result.status != "ok" or not busy:
        return result
    longest = max(min(MAX_WAIT_S, MAX_WAIT_SHARE * budget_s, left_s / 4), 0.0)
    say(f"trial {result.trial_id}: measured while the machine was busy ({busy}); "
        f"waiting up to {format_seconds(longest)} for it to be quiet, then measuring it again")
    quiet, waited, share = (wait or wait_for_quiet)(longest)
    again = run_again()
    again.tags = {**(again.tags or {}), "remeasured": {
        "first_samples_per_s": first["metrics"].get("samples_per_s"),
        "first_interference": first["metrics"].get("interference"),
        "waited_s": round(waited, 1),
        "quiet_when_started": quiet,
        "others_share_when_started": round(share, 4),
    }}
    still = busy_note(again.to_dict())
    say(f"trial {result.trial_id}: measured again"
        + (f" and still busy ({still}): not a candidate for the best" if still else
           " on a quiet machine"))
    return again


class BusyWatch:
    """Since it was made (a trial's start): did others use QUIET_CPU_SHARE of the CPUs?
    A slow trial is not stopped for slowness while this says yes: its record will be
    flagged and measured again instead of ruling the configuration out."""

    def __init__(self) -> None:
        self.cpus = cpus()
        self.start = snapshot(self.cpus, ours)

    def __call__(self) -> bool:
        got = shares(self.start, snapshot(self.cpus, ours), len(self.cpus))
        return got is not None and got[0] >= QUIET_CPU_SHARE
