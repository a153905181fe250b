"""Recovery: every trial a stopped worker left RUNNING in Optuna ends with one record.

`recover` runs when a tuner starts (--resume too); `settle` runs it before each
trial the tuner asks for, after failing the trials whose heartbeats stopped.
Every trial is written record first, then Optuna (harness.tune.context), so the
record is the authority. A RUNNING trial is settled when

    its record is in trials.jsonl       (whoever its owner, however young) Optuna is
                                        told what it says; a trial whose worker
                                        stopped when the storage went away (tag
                                        "unreachable") is also queued to run again
    its worker is gone (below) and
      only its result.json exists       the record is appended, then Optuna told
      nothing exists                    a `failed` record (tag "orphan"), Optuna's
                                        trial FAIL, and the configuration queued
                                        to run again (storage.retries times)

A worker is gone when its process (harness.tune.workers.Worker) no longer runs on
this host. One on another host is taken to run; a trial with no owner tag is left
alone for its first minute (another worker may have just asked for it; the
tuner's storage tags the trials ask() creates as it creates them, so this is
rare). On an RDB storage a worker on another host is known dead by its silence:
Optuna fails a trial without a heartbeat for storage.grace, and `StaleTrials`
(the storage's stale-trial callback, in whichever worker noticed) writes the
failed record and queues the retry the same way.

A retry is a queued trial with the user attrs {"retry_of": <first number>,
"retry_history": [<numbers run so far>]}.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from harness.records.result import read_result
from harness.tune.context import RETRY_OF
from harness.tune.storage import fail_stale_trials
from harness.tune.workers import Worker

if TYPE_CHECKING:
    from harness.tune.context import StudyContext

# A RUNNING trial without a worker tag this old was abandoned: its tuner died between
# Optuna's ask and the tag (milliseconds). Younger, it may be another worker's that
# has just asked: tuners sharing a storage start at the same moment.
UNTAGGED_GRACE_S = 60


def recover(ctx: StudyContext) -> list[str]:
    """Settle the trials that stopped workers left RUNNING; returns what was done, in
    words. Workers sharing the run folder take turns (a lock), and each trial is
    claimed in the storage first, so a trial is settled, recorded and retried once."""
    running = ctx.optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return []
    if not any(_abandoned(t) for t in running) and not _recorded(ctx, running):
        return []
    notes = []
    with ctx.run.store.locked("settle"):
        records = _by_number(ctx.run.store.records())
        for t in running:
            if t.number in records or _abandoned(t):
                note = _settle_one(ctx, t, records.get(t.number))
                if note:
                    notes.append(note)
    return notes


def settle(ctx: StudyContext) -> list[str]:
    """Before each trial: fail (and retry) the trials of workers that died."""
    fail_stale_trials(ctx.optuna_study, ctx.storage)  # RDB heartbeats: calls StaleTrials
    return recover(ctx)


def _by_number(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {n: r for r in records if isinstance(n := (r.get("tags") or {}).get("optuna_number"),
                                                  int)}


def _recorded(ctx: StudyContext, running: list[FrozenTrial]) -> bool:
    numbers = {t.number for t in running}
    return any(n in numbers for n in _by_number(ctx.run.store.records()))


def _abandoned(t: FrozenTrial) -> bool:
    owner = Worker.parse(t.user_attrs.get("worker"))
    if owner is not None:
        return not owner.alive()
    # No owner yet: killed between ask and tagging, or a worker that has just asked.
    age = time.time() - t.datetime_start.timestamp() if t.datetime_start else 0.0
    return age > UNTAGGED_GRACE_S


def _settle_one(ctx: StudyContext, t: FrozenTrial, record: dict | None) -> str | None:
    store = ctx.run.store
    tid = t.user_attrs.get("trial_id", t.number)
    note = None
    path = store.trial_dir(tid) / "result.json"
    if record is None and path.exists():
        found = read_result(path)
        found.tags = {**found.tags, "phase": t.user_attrs.get("phase", "search"),
                      "optuna_number": t.number}
        store.append(found)
        record, note = found.to_dict(), f"trial {tid}: finished before its tuner stopped; recorded"
    if record is not None:
        try:
            ctx.tell(t.number, record)
        except UpdateFinishedTrialError:  # another worker told it
            return None
        ctx.remember(record)
        if (record.get("tags") or {}).get("unreachable"):  # its worker could not queue it
            retry = _may_retry(ctx, t)
            if retry:
                _queue_retry(ctx, t)
            words = "queued to run again" if retry else "not run again (retries spent)"
            return f"trial {tid}: its worker stopped when the storage went away; {words}"
        return note
    try:  # claim it: of several workers noticing, one sets FAIL
        ctx.storage.set_trial_state_values(ctx.storage_id(t.number), state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return None
    return _record_dead(ctx, t, "the tuner running this trial{who} stopped before it ended")


class StaleTrials:
    """The storage's stale-trial callback: Optuna has failed `trial` (no heartbeat for
    storage.grace); record it as failed and queue its configuration again."""

    def __init__(self, ctx: StudyContext):
        self.ctx = ctx

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        grace = self.ctx.study.storage.grace
        note = _record_dead(self.ctx, trial, "the worker running this trial{who} sent no "
                                             f"heartbeat for {grace}", stale=True)
        self.ctx.on_event("note", {"text": note})


def _record_dead(ctx: StudyContext, t: FrozenTrial, cause: str, **tags: object) -> str:
    """A failed trial (FAIL already) whose worker died: record it, queue it again, say
    so. `cause` may name the worker with {who}."""
    retry = _may_retry(ctx, t)
    owner = Worker.parse(t.user_attrs.get("worker"))
    cause = cause.format(who=f" ({owner.describe()})" if owner else "")
    words = "queued to run again" if retry else "not run again (retries spent)"
    tid = t.user_attrs.get("trial_id", t.number)
    started = t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else ""
    ctx.run.store.append(ctx.failed_record(
        tid, t.user_attrs.get("plan"), started, {
            "phase": t.user_attrs.get("phase", "search"), "optuna_number": t.number,
            "orphan": True, **tags}, f"{cause}; {words}"))
    if retry:
        _queue_retry(ctx, t)
    return f"trial {tid}: {cause}; marked failed, {words}"


def _may_retry(ctx: StudyContext, t: FrozenTrial) -> bool:
    """Whether the failed trial's configuration runs again: not when it ran
    storage.retries + 1 times already, nor for an ablation trial (the ablation runs its
    own again)."""
    if not t.params or t.user_attrs.get("phase") == "ablation":
        return False
    return len(t.user_attrs.get("retry_history", [])) < ctx.study.storage.retries


def _queue_retry(ctx: StudyContext, t: FrozenTrial) -> None:
    ctx.optuna_study.enqueue_trial(t.params, user_attrs={
        "phase": t.user_attrs.get("phase", "search"),
        RETRY_OF: t.user_attrs.get(RETRY_OF, t.number),
        "retry_history": [*t.user_attrs.get("retry_history", []), t.number]})
