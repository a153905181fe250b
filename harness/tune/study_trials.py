"""What the study's trials say so far: the reference trials, the retries owed a run, the best."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from training_harness.records.tags import REFERENCE_PHASES
from training_harness.study.study_file import Study

BEST_BY_REPEATS = "best_by_repeats"  # user attr: the confirmation rounds' decision (final/)
RETRY_OF = "retry_of"  # user attr of a queued retry: the number of the trial it runs again


@dataclass
class StudyTrials:
    optuna_study: optuna.Study
    study: Study  # its objectives and directions

    def reference_trials(self) -> list[FrozenTrial]:
        return [t for t in self.optuna_study.get_trials(deepcopy=False)
                if t.user_attrs.get("phase", "search") in REFERENCE_PHASES]

    def retries_waiting(self) -> bool:
        """A dead worker's trial queued again is owed a run before n_trials stops us."""
        waiting = self.optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        return any(RETRY_OF in t.user_attrs for t in waiting)

    def n_reference_trials(self) -> int:
        """Trials towards budget.n_trials: a dead worker's trial counts, its retry not."""
        return sum(t.state != TrialState.WAITING and RETRY_OF not in t.user_attrs
                   for t in self.reference_trials())

    def best_trial(self) -> FrozenTrial | None:
        """The feasible trial with the highest throughput (on a Pareto front too), or the
        one the confirmation rounds named."""
        feasible = [t for t in self.reference_trials() if t.state == TrialState.COMPLETE
                    and all(v <= 0 for v in t.constraints.values()) and t.values]
        chosen = (self.optuna_study.user_attrs.get(BEST_BY_REPEATS) or {}).get("best")
        named = [t for t in feasible if str(t.user_attrs.get("trial_id", t.number)) == chosen]
        # named from repeats (training_harness.tune.final.confirmation), not from one measurement
        if named:
            return named[0]
        objectives = self.study.objectives
        i = objectives.index("throughput") if "throughput" in objectives else 0
        sign = 1 if self.study.directions[i] == "maximize" else -1
        return max(feasible, key=lambda t: sign * t.values[i], default=None)

    def best_throughput(self) -> tuple[float, str] | None:
        best = self.best_trial()
        if best is None or "throughput" not in self.study.objectives:
            return None
        i = self.study.objectives.index("throughput")
        return best.values[i], str(best.user_attrs.get("trial_id", best.number))
