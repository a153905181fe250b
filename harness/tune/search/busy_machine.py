"""A trial measured while the machine was busy is measured again once it is quiet.

A flagged figure (metrics.interference) is the busy machine's, not the configuration's:
the tuner waits for quiet (a bounded wait), then runs the trial once more under the same
id; docs/tuning.md ("A busy machine is noticed") has the rule.
"""

from __future__ import annotations

from collections.abc import Callable

from training_harness.core.interference import wait_for_quiet
from training_harness.core.units import format_seconds
from training_harness.records.predicates import busy_note
from training_harness.records.result import TrialResult

MAX_WAIT_S = 60.0  # the longest wait for quiet before measuring again anyway
MAX_WAIT_SHARE = 0.05  # ... and at most this share of the study's budget


def measure_again_if_busy(result: TrialResult, run_again: Callable[[], TrialResult],
                          budget_s: float, left_s: float, say: Callable[[str], None]
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
    quiet, waited, share = wait_for_quiet(longest)
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
