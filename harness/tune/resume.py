"""Trials whose worker died: what a stopped tuner left RUNNING in Optuna is settled.

`recover` runs when a tuner starts (--resume) and before each trial it asks for.
A RUNNING trial whose owner (harness.tune.workers.Worker) still runs, or runs on
another host, is left alone, and so is one not tagged with its owner yet for its
first minute (another worker may have just asked for it). Otherwise, in the order
the tuner writes them:

    the record is in trials.jsonl       Optuna is told what it says
    only the trial's result.json        the record is appended, then Optuna told
    neither                             a `failed` record (tag "orphan"), Optuna's
                                        trial FAIL, and the configuration queued
                                        to run again (storage.retries times)

On an RDB storage a worker on another host is known dead by its silence: Optuna
fails a trial without a heartbeat for storage.grace, and `StaleTrials` (the
storage's stale-trial callback, in whichever worker noticed) writes the failed
record and queues the retry the same way.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from harness.records.result import TrialResult, read_result
from harness.tune.sampling import outcome, tell
from harness.tune.storage import fail_stale_trials
from harness.tune.trial_job import StudyRun, command_for
from harness.tune.workers import Worker

if TYPE_CHECKING:
    from harness.tune.tuner import Tuner

# A RUNNING trial without a worker tag this old was abandoned: its tuner died between
# Optuna's ask and the tag (milliseconds). Younger, it may be another worker's that
# has just asked: tuners sharing a storage start at the same moment.
UNTAGGED_GRACE_S = 60


def recover(tuner: Tuner) -> list[str]:
    """Settle the trials dead workers left RUNNING; returns what was done, in words.
    Workers sharing the run folder take turns (a lock), and each trial is claimed in
    the storage first, so a trial is settled, recorded and retried once."""
    running = [t for t in tuner.optuna_study.get_trials(deepcopy=False,
                                                        states=(TrialState.RUNNING,))
               if _abandoned(t)]
    if not running:
        return []
    notes = []
    with tuner.run.store.locked("settle"):
        records = {str(r.get("trial_id")): r for r in tuner.run.store.records()}
        for t in running:
            note = _settle_one(tuner, t, records)
            if note:
                notes.append(note)
    return notes


def _abandoned(t: optuna.trial.FrozenTrial) -> bool:
    owner = Worker.parse(t.user_attrs.get("worker"))
    if owner is not None:
        return not owner.alive()
    # No owner yet: killed between ask and tagging, or a worker that has just asked.
    age = time.time() - t.datetime_start.timestamp() if t.datetime_start else 0.0
    return age > UNTAGGED_GRACE_S


def _settle_one(tuner: Tuner, t: optuna.trial.FrozenTrial, records: dict) -> str | None:
    study, store = tuner.optuna_study, tuner.run.store
    tid = t.user_attrs.get("trial_id", t.number)
    record, note = records.get(str(tid)), None
    path = store.trial_dir(tid) / "result.json"
    if record is None and path.exists():
        found = read_result(path)
        found.tags = {**found.tags, "phase": t.user_attrs.get("phase", "search"),
                      "optuna_number": t.number}
        store.append(found)
        record, note = found.to_dict(), f"trial {tid}: finished before its tuner stopped; recorded"
    if record is not None:
        with contextlib.suppress(UpdateFinishedTrialError):  # another worker told it
            tell(study, optuna.Trial(study, t._trial_id),
                 outcome(record, tuner.study.objectives, tuner.run.budget_bytes))
        tuner.remember(record)
        return note
    try:  # claim it: of several workers noticing, one sets FAIL
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return None
    return _record_dead(tuner, t, "the tuner running this trial{who} stopped before it ended")


def settle(tuner: Tuner) -> list[str]:
    """Before each trial: fail (and retry) the trials of workers that died."""
    fail_stale_trials(tuner.optuna_study)  # RDB heartbeats: calls StaleTrials
    return recover(tuner)


class StaleTrials:
    """The storage's stale-trial callback: Optuna has failed `trial` (no heartbeat for
    storage.grace); record it as failed and queue its configuration again."""

    def __init__(self, tuner: Tuner):
        self.tuner = tuner

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        grace = self.tuner.study.storage.grace
        note = _record_dead(self.tuner, trial, "the worker running this trial{who} sent no "
                                               f"heartbeat for {grace}", stale=True)
        self.tuner.on_event("note", {"text": note})


def _record_dead(tuner: Tuner, t: optuna.trial.FrozenTrial, cause: str, **tags: object) -> str:
    """A failed trial (FAIL already) whose worker died: queue it again, record it, say so.
    `cause` may name the worker with {who}."""
    retried = _retry(tuner.optuna_study, t, tuner.study.storage.retries)
    owner = Worker.parse(t.user_attrs.get("worker"))
    cause = cause.format(who=f" ({owner.describe()})" if owner else "")
    words = "queued to run again" if retried else "not run again (retries spent)"
    result = _orphan(tuner.run, t, f"{cause}; {words}")
    result.tags.update(tags)
    tuner.run.store.append(result)
    return f"trial {result.trial_id}: {cause}; marked failed, {words}"


def _retry(study: optuna.Study, trial: optuna.trial.FrozenTrial, retries: int) -> bool:
    """Queue the failed trial's configuration again, unless it was retried `retries`
    times already (Optuna's RetryFailedTrialCallback keeps the history)."""
    from optuna.storages import RetryFailedTrialCallback

    if not trial.params or trial.user_attrs.get("phase") == "ablation":
        return False
    before = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    RetryFailedTrialCallback(max_retry=retries)(study, trial)
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))) > before


def _orphan(run: StudyRun, t: optuna.trial.FrozenTrial, reason: str) -> TrialResult:
    from harness.records.result import empty_metrics

    tid = t.user_attrs.get("trial_id", t.number)
    return TrialResult(
        study=run.name, trial_id=tid, status="failed", reason=reason,
        plan=t.user_attrs.get("plan") or {}, predicted=None, metrics=empty_metrics(),
        command=command_for(run.store, tid),
        started_at=t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else "",
        tags={"phase": t.user_attrs.get("phase", "search"), "optuna_number": t.number,
              "orphan": True},
    )
