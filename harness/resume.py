"""Resuming a study whose tuner stopped: what it left RUNNING in Optuna is settled.

A trial whose owner (another worker, harness.workers.Worker) still runs is left
alone. Otherwise, in the order the tuner writes them:

    the record is in trials.jsonl       Optuna is told what it says
    only the trial's result.json        the record is appended, then Optuna told
    neither                             a `failed` record (tag "orphan"), and
                                        Optuna's trial FAIL: it is not re-run
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from harness.result import TrialResult, read_result
from harness.sampling import outcome, tell
from harness.trial_job import StudyRun, command_for
from harness.workers import Worker

if TYPE_CHECKING:
    from harness.tuner import Tuner


def recover(tuner: Tuner) -> list[str]:
    """Settle the trials a stopped tuner left RUNNING; returns what was done, in words."""
    notes = []
    records = {str(r.get("trial_id")): r for r in tuner.run.store.records()}
    for t in tuner.optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = Worker.parse(t.user_attrs.get("worker"))
        if owner is not None and owner.alive():
            continue  # another worker is running it
        tid = t.user_attrs.get("trial_id", t.number)
        record = records.get(str(tid))
        path = tuner.run.store.trial_dir(tid) / "result.json"
        if record is None and path.exists():
            found = read_result(path)
            found.tags = {**found.tags, "phase": t.user_attrs.get("phase", "search"),
                          "optuna_number": t.number}
            tuner.run.store.append(found)
            record = found.to_dict()
            notes.append(f"trial {tid}: finished before the tuner stopped; recorded")
        if record is None:
            result = _orphan(tuner.run, t, owner)
            tuner.run.store.append(result)
            record = result.to_dict()
            notes.append(f"trial {tid}: its tuner stopped while it ran; marked failed")
        trial = optuna.Trial(tuner.optuna_study, t._trial_id)
        tell(tuner.optuna_study, trial, outcome(record, tuner.study.objectives,
                                               tuner.run.budget_bytes))
        tuner.remember(record)
    return notes


def _orphan(run: StudyRun, t: optuna.trial.FrozenTrial, owner: Worker | None) -> TrialResult:
    from harness.result import empty_metrics

    tid = t.user_attrs.get("trial_id", t.number)
    who = f" ({owner.describe()})" if owner else ""
    return TrialResult(
        study=run.name, trial_id=tid, status="failed",
        reason=f"the tuner running this trial{who} stopped before it ended; not re-run",
        plan=t.user_attrs.get("plan") or {}, predicted=None, metrics=empty_metrics(),
        command=command_for(run.store, tid),
        started_at=t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else "",
        tags={"phase": t.user_attrs.get("phase", "search"), "optuna_number": t.number,
              "orphan": True},
    )
