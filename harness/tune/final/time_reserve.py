"""The time kept after the search: what the confirmation and the ablation are expected to cost.

The search runs until the time left is what the final phases are expected to need
(a fixed share of the budget left short studies idle at their end):

    final trials = (contenders + the baseline) x confirm_repeats  (confirmation.py)
                 + (the best + one per technique it uses) x ablation_repeats
    reserve      = MARGIN x final trials x a launched trial's median duration so far,
                   at most clock.reserve_cap_s: ablation_share of the budget (all of
                   it before any trial ran)
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from harness.records.tags import tags_of
from harness.tune.budget import MARGIN
from harness.tune.final.ablation import techniques
from harness.tune.final.confirmation import contenders, ranked_by

if TYPE_CHECKING:
    from harness.tune.tuner_state import TunerState


def trial_seconds(records: list[dict[str, Any]]) -> float | None:
    """A launched trial's median duration (ok, measured, not a repeat of an earlier one),
    less its training to a target loss: the final phases take those steps from the cache."""
    durations = [r["duration_s"] - _trained_s(r) for r in records if r["status"] == "ok"
                 and r.get("duration_s") and "duplicate_of" not in tags_of(r)]
    return statistics.median(durations) if durations else None


def _trained_s(record: dict[str, Any]) -> float:
    runs = ((record.get("metrics") or {}).get("convergence") or {}).get("runs") or []
    return sum(r.get("train_s", 0.0) + r.get("eval_s", 0.0) for r in runs if not r.get("cached"))


def round_trials(ctx: TunerState, records: list[dict[str, Any]]) -> int:
    """Trials in one confirmation round: the contenders and the baseline (0 when fewer
    than two configurations may be the best, or nothing ranks them)."""
    by = ranked_by(ctx.study.objectives)
    if by is None:
        return 0
    picked = contenders(records, ctx.study.budget.confirm_margin, ctx.run.budget_bytes, by=by)
    return len(picked) + 1 if len(picked) >= 2 else 0


def ablation_round_trials(ctx: TunerState) -> int:
    """Trials in one ablation repeat: the best, and one per technique it uses."""
    best = ctx.best_trial()
    return 1 + len(techniques(ctx.space, best.params)) if best is not None else 0


def final_trials(ctx: TunerState, records: list[dict[str, Any]]) -> int:
    budget = ctx.study.budget
    return (round_trials(ctx, records) * budget.confirm_repeats
            + ablation_round_trials(ctx) * budget.ablation_repeats)


def reserve_s(ctx: TunerState) -> float:
    """Seconds to keep for the final phases, as the study stands now."""
    cap = ctx.clock.reserve_cap_s  # the same on every worker: the main worker's clock
    records = ctx.run.store.records()
    each = trial_seconds(records)
    if each is None:
        return cap
    return min(cap, MARGIN * each * final_trials(ctx, records))
