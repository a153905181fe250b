"""The time kept after the search: what the confirmation and the ablation are expected to cost.

The search runs until the time left is what the final phases are expected to need
(a fixed share of the budget left short studies idle at their end):

    final trials = (contenders + the baseline) x confirm_repeats  (confirmation.py)
                 + (the best + one per technique it uses) x ablation_repeats
    reserve      = MARGIN x final trials x a launched trial's median duration so far,
                   at most clock.reserve_cap_s: ablation_share of the budget (all of
                   it before any trial ran)

Once the search has ended early, what more fits: the variants, and confirmation rounds
up to MAX_ROUNDS, those beyond confirm_repeats with LONGER_WINDOW times longer windows.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from training_harness.records.run_store import RunStore
from training_harness.records.tags import tags_of
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.budget import MARGIN, Clock
from training_harness.tune.final.ablation import techniques
from training_harness.tune.final.confirmation import contenders, ranked_by, window_s
from training_harness.tune.study_trials import StudyTrials

MAX_ROUNDS = 10  # confirmation rounds, however much time is left
LONGER_WINDOW = 4  # the extra rounds' windows, times the contender's own


def trial_seconds(records: list[dict[str, Any]]) -> float | None:
    """A launched trial's median duration (ok, measured, not a repeat of an earlier one),
    less its training to a target loss: the final phases take those steps from the cache."""
    durations = [r["duration_s"] - _trained_s(r) for r in records if r["status"] == "ok"
                 and r.get("duration_s") and "duplicate_of" not in tags_of(r)]
    return statistics.median(durations) if durations else None


def _trained_s(record: dict[str, Any]) -> float:
    runs = ((record.get("metrics") or {}).get("convergence") or {}).get("runs") or []
    return sum(r.get("train_s", 0.0) + r.get("eval_s", 0.0) for r in runs if not r.get("cached"))


def _longer_trial_s(records: list, each: float) -> float:
    """A trial's seconds when its window is LONGER_WINDOW times as long."""
    seconds = [window_s(r) for r in records if r["status"] == "ok" and window_s(r)]
    return each + (LONGER_WINDOW - 1) * (statistics.median(seconds) if seconds else 0.0)


@dataclass
class FinalTime:
    """The final phases' trials against the time left: what to keep for them during the
    search, and what more fits once it ended (variants, more confirmation rounds)."""

    study: Study
    space: SearchSpace
    clock: Clock
    store: RunStore
    budget_bytes: float
    trials: StudyTrials  # the best so far: its techniques are the ablation's trials

    def round_trials(self, records: list[dict[str, Any]]) -> int:
        """Trials in one confirmation round: the contenders and the baseline (0 when
        fewer than two configurations may be the best, or nothing ranks them)."""
        by = ranked_by(self.study.objectives)
        picked = (contenders(records, self.study.budget.confirm_margin, self.budget_bytes,
                             by=by) if by else [])
        return len(picked) + 1 if len(picked) >= 2 else 0

    def ablation_trials(self) -> int:
        """The ablation's trials: the best and one per technique it uses, each repeat."""
        best = self.trials.best_trial()
        per = 1 + len(techniques(self.space, best.params)) if best is not None else 0
        return per * self.study.budget.ablation_repeats

    def final_trials(self, records: list[dict[str, Any]]) -> int:
        return self.round_trials(records) * self.study.budget.confirm_repeats \
            + self.ablation_trials()

    def reserve_s(self) -> float:
        """Seconds to keep for the final phases, as the study stands now."""
        cap = self.clock.reserve_cap_s  # the same on every worker: the main worker's clock
        records = self.store.records()
        each = trial_seconds(records)
        if each is None:
            return cap
        return min(cap, MARGIN * each * self.final_trials(records))

    def variant_fits(self) -> bool:
        """Whether one more variant fits beside the confirmation and the ablation's trials."""
        records = self.store.records()
        each = trial_seconds(records)
        if each is None:
            return False
        return self.clock.left() >= MARGIN * each * (1 + self.final_trials(records))

    def extra_round_fits(self, trials: int) -> bool:
        """Whether a further confirmation round of `trials` trials, with LONGER_WINDOW
        times longer windows, fits in the time left beside the ablation."""
        records = self.store.records()
        each = trial_seconds(records)
        if each is None:
            return False
        ablation = MARGIN * each * self.ablation_trials()
        return self.clock.left() - ablation >= MARGIN * _longer_trial_s(records, each) * trials

    def rounds_that_fit(self) -> int:
        """Confirmation rounds that fit the time left beside the ablation, from
        budget.confirm_repeats to MAX_ROUNDS."""
        budget = self.study.budget
        records = self.store.records()
        each = trial_seconds(records)
        per_round = self.round_trials(records)
        if each is None or not per_round:
            return budget.confirm_repeats
        ablation = MARGIN * each * self.ablation_trials()
        left = self.clock.left() - ablation - MARGIN * each * per_round * budget.confirm_repeats
        # the rounds beyond confirm_repeats measure LONGER_WINDOW times as long a window
        longer = _longer_trial_s(records, each)
        fit = budget.confirm_repeats + int(max(0.0, left) // (MARGIN * longer * per_round))
        return max(budget.confirm_repeats, min(MAX_ROUNDS, fit))
