"""This worker's trials, held, recorded, then told to Optuna (Recorder), and the
configurations measured so far (Measured).

Every trial is written in one order (`record_then_tell`): the record first
(trials/<id>/result.json, then a line in trials.jsonl), then Optuna (the trial's
status, plan and constraints, then its state). A worker that stops between the two
loses nothing: recovery (training_harness.tune.recovery.resume) tells Optuna what the record says.
The record is the authority.

The trials this worker holds (RUNNING here, no record yet) are `held`
(training_harness.tune.held): a worker that loses the storage records them first
(`record_held`, the storage's on_give_up).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from training_harness.tune.held import Held, HeldTrials
from training_harness.tune.optuna_outcome import outcome
from training_harness.tune.storage import Heartbeat, PatientStorage
from training_harness.tune.trial_job import command_for
from training_harness.tune.workers import Worker


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
