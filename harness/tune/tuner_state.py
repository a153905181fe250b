"""What the search, the ablation and the recovery of one study share: TunerState.

harness.tune.search.loop (the search), harness.tune.final.ablation and
harness.tune.recovery.resume each take the TunerState of their `harness tune`
process; none of them imports another.

Every trial is written in one order (`record_then_tell`): the record first
(trials/<id>/result.json, then a line in trials.jsonl), then Optuna (the trial's
status, plan and constraints, then its state). A worker that stops between the two
loses nothing: recovery (harness.tune.recovery.resume) tells Optuna what the record says.
The record is the authority.

The trials this worker holds (RUNNING here, no record yet) are `held`
(harness.tune.recovery.held): a worker that loses the storage records them first.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from harness.records.predicates import is_reference
from harness.records.result import TrialResult
from harness.records.tags import PRUNED_SLOW, REFERENCE_PHASES, tags_of
from harness.study.search_space import SearchSpace, config_key
from harness.study.study_file import Study
from harness.tune.budget import Clock
from harness.tune.recovery.held import Held, HeldTrials
from harness.tune.recovery.storage import Heartbeat, PatientStorage
from harness.tune.recovery.workers import Worker
from harness.tune.search import sampling
from harness.tune.search.correction import Corrections
from harness.tune.search.sampling import outcome
from harness.tune.trial_job import TrialRunner, command_for

BEST_BY_REPEATS = "best_by_repeats"  # user attr: the confirmation rounds' decision (final/)
RETRY_OF = "retry_of"  # user attr of a queued retry: the number of the trial it runs again


@dataclass
class TunerState:
    study: Study
    space: SearchSpace
    optuna_study: optuna.Study
    storage: BaseStorage  # the object make_storage returned (PatientStorage for an RDB)
    run: TrialRunner
    clock: Clock
    me: Worker = field(default_factory=lambda: Worker.this())
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # config key -> record
    held: HeldTrials = field(default_factory=HeldTrials)  # RUNNING here, no record yet
    slow_once: dict[str, int] = field(default_factory=dict)  # config key -> slow stops

    def __post_init__(self) -> None:
        self.correction = Corrections(self.run.store.records, self.run.facts.device_type)
        for r in self.run.store.records():
            self.remember(r)
        if isinstance(self.storage, PatientStorage):
            self.storage.stamp = {"worker": self.me.tag}
            self.storage.on_claim = self._claimed
            self.storage.on_give_up = self._give_up

    # --- the storage's ids ------------------------------------------------------------
    @functools.cached_property
    def study_id(self) -> int:
        return self.storage.get_study_id_from_name(self.optuna_study.study_name)

    def storage_id(self, number: int) -> int:
        """The storage's id of trial `number` (what heartbeats and states are set on)."""
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    # --- the trials this worker holds (harness.tune.recovery.held) -------------------
    def holding(self, number: int, trial_id: int | str | None = None, phase: str = "search",
                plan: dict[str, Any] | None = None) -> contextlib.AbstractContextManager[Held]:
        """Hold trial `number` while the block runs; meanwhile its heartbeat beats (RDB
        storages), until Optuna is told."""
        return self.held.holding(number, trial_id, phase, plan,
                                 lambda: self._heartbeat(number))

    def _heartbeat(self, number: int) -> contextlib.AbstractContextManager:
        if not isinstance(self.storage, PatientStorage):
            return contextlib.nullcontext()
        return Heartbeat(self.storage, self.storage_id(number))

    def _claimed(self, trial: FrozenTrial) -> None:
        """PatientStorage.on_claim: ask() has taken this queued trial."""
        attrs = trial.user_attrs
        self.held.hold(trial.number, attrs.get("trial_id"), attrs.get("phase", "search"),
                       attrs.get("plan"))

    def _give_up(self) -> None:
        """PatientStorage.on_give_up: the held trials' records, before the worker stops."""
        self.held.give_up(lambda held, tags, reason: self.run.store.append(self.failed_record(
            held.trial_id, held.plan, held.started_at, tags, reason)))

    def start_trial(self, params: dict[str, Any], distributions: dict[str, Any],
                    user_attrs: dict[str, Any]) -> int:
        """A trial run outside ask/tell (the ablation's): RUNNING in the storage, owned by
        this worker from the first moment; returns its number (to hold it: `holding`)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions=distributions,
            user_attrs={**user_attrs, "worker": self.me.tag})
        return self.storage.get_trial_number_from_id(
            self.storage.create_new_trial(self.study_id, template_trial=template))

    # --- records, then Optuna ---------------------------------------------------------
    def record_then_tell(self, result: TrialResult, number: int,
                         trial: optuna.Trial | None = None) -> bool:
        """Write the trial's record, then tell Optuna what it says. False when another
        worker had failed the trial meanwhile (its silence taken for death): the
        record stands here, the storage keeps that worker's verdict. (A worker sharing
        this run folder may have told it from this record first: that is fine.)"""
        result.write(self.run.store.trial_dir(result.trial_id) / "result.json")
        self.run.store.append(result)
        self.held.recorded(number)
        record = result.to_dict()
        self.remember(record)
        try:
            self.tell(number, record, trial)
        except UpdateFinishedTrialError:  # told already: from this record (resume.py)?
            told = self.storage.get_trial(self.storage_id(number)).state
            return told == outcome(record, self.study.objectives, self.run.budget_bytes).state
        return True

    def tell(self, number: int, record: dict[str, Any],
             trial: optuna.Trial | None = None) -> None:
        """Tell Optuna trial `number`'s record: status and plan, constraints, state.
        Raises UpdateFinishedTrialError when the trial was finished already."""
        trial = trial or optuna.Trial(self.optuna_study, self.storage_id(number))
        trial.set_user_attr("status", record["status"])
        if record.get("plan"):
            trial.set_user_attr("plan", record["plan"])
        try:
            sampling.tell(self.optuna_study, trial, outcome(record, self.study.objectives,
                                                            self.run.budget_bytes))
        except ValueError:  # Study.tell's word for a trial told meanwhile, by another worker
            if not self.storage.get_trial(self.storage_id(number)).state.is_finished():
                raise
            raise UpdateFinishedTrialError(f"trial {number} was told meanwhile") from None

    def failed_record(self, trial_id: int | str, plan: dict[str, Any] | None, started_at: str,
                      tags: dict[str, Any], reason: str) -> TrialResult:
        """The record of a trial that never ended (its worker died or stopped)."""
        return TrialResult.not_measured(
            "failed", reason, study=self.run.name, trial_id=trial_id, plan=plan or {},
            predicted=None, command=command_for(self.run.store, trial_id),
            started_at=started_at, tags=tags)

    def remember(self, record: dict[str, Any]) -> None:
        """Keep a measured configuration's record, so a repeat proposal reuses it. A
        trial stopped early for slowness is kept the second time only: proposed again
        once, it runs again (on a shared machine one unlucky moment should not rule a
        configuration out), but not a third time. One measured twice on a busy machine
        is kept (harness.tune.search.busy_machine)."""
        if not is_reference(record):
            return
        if tags_of(record).get("pruned") == PRUNED_SLOW:
            k = config_key(record["plan"])
            self.slow_once[k] = self.slow_once.get(k, 0) + 1
            if self.slow_once[k] < 2:
                return
        # FAIL says nothing of the configuration, except a figure still flagged after it
        # was measured again: kept, so the search does not run it over and over.
        busy = ((record.get("metrics") or {}).get("interference") or {}).get("flagged")
        if not busy and outcome(record, self.study.objectives,
                                self.run.budget_bytes).state == TrialState.FAIL:
            return
        self.measured.setdefault(config_key(record["plan"]), record)

    # --- what the study knows so far ----------------------------------------------------
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
        if named:  # named from repeats (harness.tune.final.confirmation), not from one measurement
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
