"""What the search, the ablation and the recovery of one study share: TunerState.

harness.tune.search.loop (the search), harness.tune.final.ablation and
harness.tune.recovery.resume each take the TunerState of their `harness tune`
process; none of them imports another.

Every trial is written in one order (`record_then_tell`): the record first
(trials/<id>/result.json, then a line in trials.jsonl), then Optuna (the trial's
status, plan and constraints, then its state). A worker that stops between the two
loses nothing: recovery (harness.tune.recovery.resume) tells Optuna what the record says.
The record is the authority.

The trials this worker holds (`held`: from the moment each is RUNNING in the storage
until its record is written; several when trials run as jobs in flight at once,
harness.tune.search.jobs_in_flight) are remembered. When the storage gives up on an
unreachable database (StorageUnreachable, after storage.patience), each held trial
gets a `failed` record (tags orphan and unreachable: FAIL for Optuna) before the
worker stops; once the database is back, recovery tells Optuna so and queues the
configuration again. So every trial in the storage ends with exactly one record,
whatever moment the database goes away. (PatientStorage reports the trial that
ask() takes before ask() returns, and tags a trial that ask() creates with its
worker as it is created.)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
from harness.tune.final.confirmation import KEY as CONFIRMED
from harness.tune.recovery.storage import Heartbeat, PatientStorage
from harness.tune.recovery.workers import Worker
from harness.tune.search import sampling
from harness.tune.search.busy_machine import measure_again_if_busy
from harness.tune.search.correction import Calibration
from harness.tune.search.sampling import outcome
from harness.tune.trial_job import TrialRunner, command_for, run_trial_job

RETRY_OF = "retry_of"  # user attr of a queued retry: the number of the trial it runs again


@dataclass
class Held:
    """The trial this worker holds: RUNNING in the storage, no record yet."""

    number: int
    trial_id: int | str
    phase: str = "search"
    plan: dict[str, Any] | None = None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(
        timespec="seconds"))


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
    held: dict[int, Held] = field(default_factory=dict)  # by Optuna number

    def __post_init__(self) -> None:
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

    # --- the trial this worker holds ----------------------------------------------------
    def hold(self, number: int, trial_id: int | str | None = None, phase: str = "search",
             plan: dict[str, Any] | None = None) -> Held:
        """From now until its record is written, trial `number` is this worker's to record."""
        if number not in self.held:
            self.held[number] = Held(number, number if trial_id is None else trial_id, phase,
                                     plan)
        return self.held[number]

    @contextlib.contextmanager
    def holding(self, number: int, trial_id: int | str | None = None, phase: str = "search",
                plan: dict[str, Any] | None = None) -> Iterator[Held]:
        """Hold trial `number` (`hold`) while the block runs; meanwhile its heartbeat
        beats (RDB storages), until Optuna is told."""
        held = self.hold(number, trial_id, phase, plan)
        try:
            with self._heartbeat(number):
                yield held
        finally:
            if self.held.get(number) is held:
                del self.held[number]

    def _heartbeat(self, number: int) -> contextlib.AbstractContextManager:
        if not isinstance(self.storage, PatientStorage):
            return contextlib.nullcontext()
        return Heartbeat(self.storage, self.storage_id(number))

    def _claimed(self, trial: FrozenTrial) -> None:
        """PatientStorage.on_claim: ask() has taken this queued trial."""
        attrs = trial.user_attrs
        self.hold(trial.number, attrs.get("trial_id"), attrs.get("phase", "search"),
                  attrs.get("plan"))

    def _give_up(self) -> None:
        """PatientStorage.on_give_up: the held trials' records, before the worker stops."""
        for number in list(self.held):
            held = self.held.pop(number, None)
            if held is None:  # recorded meanwhile, in another trial's thread
                continue
            tags = {"phase": held.phase, "optuna_number": held.number, "orphan": True,
                    "unreachable": True}
            self.run.store.append(self.failed_record(
                held.trial_id, held.plan, held.started_at, tags,
                "the storage became unreachable while this trial was held here, and this "
                "worker stopped before it ended; --resume queues it to run again"))

    def start_trial(self, params: dict[str, Any], distributions: dict[str, Any],
                    user_attrs: dict[str, Any]) -> int:
        """A trial run outside ask/tell (the ablation's): RUNNING in the storage, owned by
        this worker from the first moment; returns its number (to hold it: `holding`)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions=distributions,
            user_attrs={**user_attrs, "worker": self.me.tag})
        return self.storage.get_trial_number_from_id(
            self.storage.create_new_trial(self.study_id, template_trial=template))

    def run_extra(self, trial_id: str, params: dict[str, Any], tags: dict[str, Any]
                  ) -> TrialResult:
        """Run one trial outside the sampler's asking (the confirmation's and the
        ablation's): RUNNING in the storage with its configuration and this worker as
        owner (never handed out by ask()), run, measured again if the machine was busy
        (harness.tune.search.busy_machine), recorded, then Optuna told."""
        plan = self.space.plan(params)
        used = self.space.distributions(params)
        phase = tags["phase"]
        number = self.start_trial({k: params[k] for k in used}, used, {
            "phase": phase, "trial_id": trial_id, "plan": plan.to_dict()})
        with self.holding(number, trial_id, phase, plan.to_dict()):
            self.on_event("start", {"trial_id": trial_id, "plan": plan.to_dict(),
                                    "phase": phase, "duplicate": False})

            def attempt() -> TrialResult:
                return run_trial_job(self.run, trial_id, plan, {**tags, "optuna_number": number},
                                     self.calibration(), self.clock.deadline)

            result = measure_again_if_busy(
                attempt(), attempt, self.clock.budget_s, self.clock.left(),
                say=lambda text: self.on_event("note", {"text": text}))
            self.record_then_tell(result, number)
        self.on_event("end", result.to_dict())
        return result

    # --- records, then Optuna ---------------------------------------------------------
    def record_then_tell(self, result: TrialResult, number: int,
                         trial: optuna.Trial | None = None) -> bool:
        """Write the trial's record, then tell Optuna what it says. False when another
        worker had failed the trial meanwhile (its silence taken for death): the
        record stands here, the storage keeps that worker's verdict. (A worker sharing
        this run folder may have told it from this record first: that is fine.)"""
        result.write(self.run.store.trial_dir(result.trial_id) / "result.json")
        self.run.store.append(result)
        self.held.pop(number, None)  # recorded: nothing more to write if the storage goes away
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
        trial stopped early for slowness is not kept: proposed again, it runs again
        (on a shared machine one unlucky moment should not rule a configuration out).
        One measured twice on a busy machine is kept (harness.tune.search.busy_machine)."""
        if not is_reference(record) or tags_of(record).get("pruned") == PRUNED_SLOW:
            return
        # FAIL says nothing of the configuration, except a figure still flagged after it
        # was measured again: kept, so the search does not run it over and over.
        busy = ((record.get("metrics") or {}).get("interference") or {}).get("flagged")
        if not busy and outcome(record, self.study.objectives,
                                self.run.budget_bytes).state == TrialState.FAIL:
            return
        self.measured.setdefault(config_key(record["plan"]), record)

    # --- what the study knows so far ----------------------------------------------------
    def calibration(self) -> Calibration:
        return Calibration.from_records(self.run.store.records(), self.run.facts.device_type)

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
        chosen = (self.optuna_study.user_attrs.get(CONFIRMED) or {}).get("best")
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
