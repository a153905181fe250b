"""This worker's trials, held, recorded, then told to Optuna (Recorder), and the
configurations measured so far (Measured).

Every trial is written in one order (`record_then_tell`): the record first
(trials/<id>/result.json, then a line in trials.jsonl), then Optuna (the trial's
status, plan and constraints, then its state). A worker that stops between the two
loses nothing: recovery (training_harness.tune.recovery.resume) tells Optuna what the record says.
The record is the authority.

The trials this worker holds (RUNNING here, no record yet, several when trials run as
jobs in flight) are `held` (HeldTrials): when the storage gives up on an unreachable
database (StorageUnreachable, after storage.patience), each gets a `failed` record (tags
orphan and unreachable) before the worker stops (`record_held`, the storage's
on_give_up); once the database is back, recovery (training_harness.tune.recovery.resume)
tells Optuna so and queues the configuration again. So every trial in the storage ends
with exactly one record, whatever moment the database goes away. (PatientStorage reports
the trial ask() takes before ask() returns, and tags a trial ask() creates with its
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
from optuna.trial import TrialState

from training_harness.records.predicates import is_reference
from training_harness.records.result import TrialResult
from training_harness.records.run_store import RunStore
from training_harness.records.tags import PRUNED_SLOW, tags_of
from training_harness.study.search_space import config_key
from training_harness.tune import optuna_outcome
from training_harness.tune.optuna_outcome import outcome
from training_harness.tune.storage import Heartbeat, PatientStorage
from training_harness.tune.trial_job import command_for
from training_harness.tune.workers import Worker


@dataclass
class Held:
    """A trial this worker holds: RUNNING in the storage, no record yet."""

    number: int
    trial_id: int | str
    phase: str = "search"
    plan: dict[str, Any] | None = None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(
        timespec="seconds"))


class HeldTrials:
    """This worker's held trials, by Optuna number. Threads of trials in flight share it."""

    def __init__(self) -> None:
        self.trials: dict[int, Held] = {}

    def hold(self, number: int, trial_id: int | str | None = None, phase: str = "search",
             plan: dict[str, Any] | None = None) -> Held:
        """From now until its record is written, trial `number` is this worker's to record."""
        if number not in self.trials:
            self.trials[number] = Held(number, number if trial_id is None else trial_id,
                                       phase, plan)
        return self.trials[number]

    def claimed(self, trial: Any) -> None:
        """PatientStorage's on_claim: ask() has taken this queued trial (a FrozenTrial)."""
        attrs = trial.user_attrs
        self.hold(trial.number, attrs.get("trial_id"), attrs.get("phase", "search"),
                  attrs.get("plan"))

    def release(self, held: Held) -> None:
        """`held` is no longer this worker's to record (its block ended)."""
        if self.trials.get(held.number) is held:
            del self.trials[held.number]

    def recorded(self, number: int) -> None:
        """Trial `number`'s record is written: nothing more to write if the storage goes."""
        self.trials.pop(number, None)

    def give_up(self, write: Callable[[Held, dict[str, Any], str], None]) -> None:
        """Before the worker stops on a lost storage: `write(held, tags, reason)` the
        failed record of every trial still held."""
        for number in list(self.trials):
            held = self.trials.pop(number, None)
            if held is None:  # recorded meanwhile, in another trial's thread
                continue
            tags = {"phase": held.phase, "optuna_number": held.number, "orphan": True,
                    "unreachable": True}
            write(held, tags, "the storage became unreachable while this trial was held "
                              "here, and this worker stopped before it ended; --resume "
                              "queues it to run again")


@dataclass
class Measured:
    """The measured configurations' records, by config key: a repeat proposal reuses one."""

    objectives: list[str]
    budget_bytes: int
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    slow_once: dict[str, int] = field(default_factory=dict)  # config key -> slow stops

    def remember(self, record: dict[str, Any]) -> None:
        """Keep a measured configuration's record. A trial stopped early for slowness is
        kept the second time only: proposed again once, it runs again (on a shared
        machine one unlucky moment should not rule a configuration out), but not a third
        time. One measured twice on a busy machine is kept
        (training_harness.tune.search.busy_machine)."""
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
        if not busy and outcome(record, self.objectives,
                                self.budget_bytes).state == TrialState.FAIL:
            return
        self.by_key.setdefault(config_key(record["plan"]), record)


@dataclass
class Recorder:
    """This worker's trials from RUNNING in the storage until Optuna is told: held
    (heartbeats beating), recorded, then told."""

    store: RunStore
    storage: BaseStorage  # the object make_storage returned (PatientStorage for an RDB)
    optuna_study: optuna.Study
    measured: Measured  # each record written is remembered there
    held: HeldTrials
    me: Worker

    @functools.cached_property
    def study_id(self) -> int:
        return self.storage.get_study_id_from_name(self.optuna_study.study_name)

    def storage_id(self, number: int) -> int:
        """The storage's id of trial `number` (what heartbeats and states are set on)."""
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    @contextlib.contextmanager
    def holding(self, number: int, trial_id: int | str | None = None, phase: str = "search",
                plan: dict[str, Any] | None = None) -> Iterator[Held]:
        """Hold trial `number` while the block runs; meanwhile its heartbeat beats (RDB
        storages; started once it is held: a storage lost on the way still finds it held)."""
        held = self.held.hold(number, trial_id, phase, plan)
        try:
            with (Heartbeat(self.storage, self.storage_id(number))
                  if isinstance(self.storage, PatientStorage) else contextlib.nullcontext()):
                yield held
        finally:
            self.held.release(held)

    def start_trial(self, params: dict[str, Any], distributions: dict[str, Any],
                    user_attrs: dict[str, Any]) -> int:
        """A trial run outside ask/tell (the ablation's): RUNNING in the storage, owned by
        this worker from the first moment; returns its number (to hold it: `holding`)."""
        template = optuna.trial.create_trial(
            state=TrialState.RUNNING, params=params, distributions=distributions,
            user_attrs={**user_attrs, "worker": self.me.tag})
        return self.storage.get_trial_number_from_id(
            self.storage.create_new_trial(self.study_id, template_trial=template))

    def record_then_tell(self, result: TrialResult, number: int,
                         trial: optuna.Trial | None = None) -> bool:
        """Write the trial's record, then tell Optuna what it says. False when another
        worker had failed the trial meanwhile (its silence taken for death): the
        record stands here, the storage keeps that worker's verdict. (A worker sharing
        this run folder may have told it from this record first: that is fine.)"""
        result.write(self.store.trial_dir(result.trial_id) / "result.json")
        self.store.append(result)
        self.held.recorded(number)
        record = result.to_dict()
        self.measured.remember(record)
        try:
            self.tell(number, record, trial)
        except UpdateFinishedTrialError:  # told already: from this record (resume.py)?
            told = self.storage.get_trial(self.storage_id(number)).state
            return told == self._outcome(record).state
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
            optuna_outcome.tell(self.optuna_study, trial, self._outcome(record))
        except ValueError:  # Study.tell's word for a trial told meanwhile, by another worker
            if not self.storage.get_trial(self.storage_id(number)).state.is_finished():
                raise
            raise UpdateFinishedTrialError(f"trial {number} was told meanwhile") from None

    def _outcome(self, record: dict[str, Any]) -> Any:
        return outcome(record, self.measured.objectives, self.measured.budget_bytes)


def failed_record(store: RunStore, study_name: str, trial_id: int | str,
                  plan: dict[str, Any] | None, started_at: str, tags: dict[str, Any],
                  reason: str) -> TrialResult:
    """The record of a trial that never ended (its worker died or stopped)."""
    return TrialResult.not_measured(
        "failed", reason, study=study_name, trial_id=trial_id, plan=plan or {},
        predicted=None, command=command_for(store, trial_id), started_at=started_at,
        tags=tags)


def record_held(held: HeldTrials, store: RunStore, study_name: str) -> None:
    """PatientStorage's on_give_up: the held trials' records, before the worker stops."""
    held.give_up(lambda h, tags, reason: store.append(failed_record(
        store, study_name, h.trial_id, h.plan, h.started_at, tags, reason)))
