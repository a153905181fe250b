"""Recovery: every trial a stopped worker left RUNNING in Optuna ends with one record.

`recover` runs when a tuner starts (--resume too); `settle` runs it before each
trial the tuner asks for, after failing the trials whose heartbeats stopped.
Every trial is written record first, then Optuna (training_harness.tune.recorder), so the
record is the authority. A RUNNING trial is settled when

    its record is in trials.jsonl       (whoever its owner, however young) Optuna is
                                        told what it says; a trial whose worker
                                        stopped when the storage went away (tag
                                        "unreachable") is also queued to run again
    its worker is gone (below) and
      only its result.json exists       the record is appended, then Optuna told
      nothing exists                    a `failed` record (tag "orphan"), Optuna's
                                        trial FAIL, and the configuration queued
                                        to run again (storage.retries times); its
                                        reason begins "record torn (...)" where a
                                        cut line of trials.jsonl was its record
                                        (below)

A worker is gone when its process (training_harness.tune.workers.Worker) no longer runs on
this host. One on another host is taken to run; a trial with no owner tag is left
alone for its first minute (another worker may have just asked for it; the
tuner's storage tags the trials ask() creates as it creates them, so this is
rare); `--resume` waits that minute out first (`wait_for_untagged`), so that no
trial of the killed tuner is left RUNNING. On an RDB storage a worker on another
host is known dead by its silence: Optuna fails a trial without a heartbeat for
storage.grace, and `StaleTrials` (the storage's stale-trial callback, in whichever
worker noticed) writes the failed record and queues the retry the same way.

A retry is a queued trial with the user attrs {"retry_of": <first number>,
"retry_history": [<numbers run so far>]}. (Optuna's RetryFailedTrialCallback is not
used: it copies every user attribute of the dead trial, its dead worker's tag among
them, and a retry asked by a live worker would look abandoned to the others until
that worker tags it. Optuna's heartbeat is: the database's RDBStorage beats and fails,
and `settle` calls optuna's fail_stale_trials on it, training_harness.tune.storage.)

A stopped worker's trial that was launched as a job that outlives it (a Slurm job:
training_harness.tune.trial_job.left_a_job) is not run again: `jobs_left` claims it for
this worker before `recover` would fail it, and the tuner waits for its job
(`rejoin`, one of the search's first trials in flight), which gives the record it
would have had. A job that ended without a record is failed and queued again as
above. A trial claimed so beats its heartbeat at once: resumed after storage.grace,
its last beat (the stopped worker's) is stale, and this worker's own `settle` must not
fail it before the wait has begun.

A stopped worker's trial that another worker failed meanwhile (its silence past
storage.grace taken for death: StaleTrials recorded it and queued its configuration
again) is nobody's to wait for: `cancel_jobs_left` cancels its job (the launcher's
`cancel_job`: scancel, then until it has left the queue), so that no job runs on
unowned once the resumed study ends.

Records cut short: a line of trials.jsonl that is not a record (power lost mid-write, a
full disk, a network file system, or a record an older harness glued onto a torn one)
is cut out when a tuner starts, --resume too (`RunStore.repair`: its bytes are copied
beside the file first, `trials.jsonl.torn-<byte>-line<N>`, and the line is named with
the file, its number and that copy). The file then parses whole, and the trial the line
was is settled once, as a trial whose record never came (`repair_records`):

    RUNNING in Optuna         `recover` settles it as any trial of a stopped worker,
                              its `failed` record's reason beginning "record torn"
    finished in Optuna,       its result.json recorded again where there is one;
    no record here            otherwise a `failed` record (tag orphan), reason
                              "record torn (...)", and the configuration queued
                              again, unless it was already

Which trial a line was is read from its bytes (its Optuna number, else its trial id);
bytes cut before either name the trials of this folder that finished with no record.
The copies stay, so a tuner stopped between the cut and the settling settles on its
next --resume; a settled trial has its record and is left alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from training_harness.records.result import TrialResult, read_result
from training_harness.records.run_store import RunStore, Unreadable
from training_harness.records.tags import tags_of
from training_harness.tune.recorder import Measured, Recorder, failed_record
from training_harness.tune.storage import PatientStorage, fail_stale_trials
from training_harness.tune.study_trials import RETRY_OF
from training_harness.tune.trial_job import TrialRunner, left_a_job, rejoin_trial_job
from training_harness.tune.workers import Worker

if TYPE_CHECKING:
    from collections.abc import Callable

# A RUNNING trial without a worker tag this old was abandoned: its tuner died between
# Optuna's ask and the tag (milliseconds). Younger, it may be another worker's that
# has just asked: tuners sharing a storage start at the same moment.
UNTAGGED_GRACE_S = 60
_sleep = time.sleep  # wait_for_untagged's wait (a test stands in for the minute)


def recover(optuna_study: optuna.Study, store: RunStore, recorder: Recorder,
            measured: Measured, retries: int) -> list[str]:
    """Settle the trials that stopped workers left RUNNING; returns what was done, in
    words. Workers sharing the run folder take turns (a lock), and each trial is
    claimed in the storage first, so a trial is settled, recorded and retried once.
    `retries`: storage.retries, the runs a dead worker's configuration gets again."""
    running = optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return []
    if not any(_abandoned(t) for t in running) and not _recorded(store, running):
        return []
    notes = []
    with store.locked("settle"):
        records = _by_number(store.records())
        for t in running:
            if t.user_attrs.get("worker") == recorder.me.tag:
                continue  # this worker's own: its thread records and tells it (in_flight)
            if t.number in records or _abandoned(t):
                note = _settle_one(optuna_study, store, recorder, measured, retries, t,
                                   records.get(t.number))
                if note:
                    notes.append(note)
    return notes


def jobs_left(optuna_study: optuna.Study, run: TrialRunner,
              recorder: Recorder) -> list[FrozenTrial]:
    """The RUNNING trials of stopped workers whose jobs may still run, claimed for this
    worker (their owner is now this one, so `recover` leaves them alone)."""
    if not run.launcher.may_leave_jobs:
        return []
    running = optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    claimed = []
    storage = recorder.storage
    with run.store.locked("settle"):  # of several workers starting, one claims each
        records = _by_number(run.store.records()) if running else {}
        for t in running:
            sid = recorder.storage_id(t.number)
            now = storage.get_trial(sid)  # its owner as of now
            tid = _tid(now)
            if (now.state == TrialState.RUNNING and now.number not in records
                    and _abandoned(now) and left_a_job(run, tid)):
                storage.set_trial_user_attr(sid, "worker", recorder.me.tag)
                if isinstance(storage, PatientStorage) and storage.get_heartbeat_interval():
                    storage.record_heartbeat(sid)  # alive again before anyone's settle
                claimed.append(now)
    return claimed


def cancel_jobs_left(optuna_study: optuna.Study, run: TrialRunner) -> list[str]:
    """Cancel the jobs still running for stopped workers' trials that were failed
    meanwhile (by another worker, from their silence: see the module's doc); what was
    done, in words. A trial whose record here is its own (not an orphan's) has ended
    with its job; a trial whose worker still runs is that worker's to end."""
    if not run.launcher.may_leave_jobs:
        return []
    failed = optuna_study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    if not failed:
        return []
    records = _by_number(run.store.records())
    notes = []
    for t in failed:
        tid = _tid(t)
        own = records.get(t.number)
        if (own is not None and not tags_of(own).get("orphan")) or not _abandoned(t):
            continue
        if left_a_job(run, tid):
            done = run.launcher.cancel_job(run.store.trial_dir(tid))
            if done:
                notes.append(f"trial {tid}: failed while its tuner was stopped (another "
                             f"worker took it for dead and queued it again): its {done}")
    return notes


def rejoin(run: TrialRunner, deadline: float, recorder: Recorder, retries: int,
           on_event: Callable[[str, dict[str, Any]], None], t: FrozenTrial,
           should_stop: Callable[[], str | None] | None = None) -> TrialResult:
    """Wait for the job of trial `t` (claimed by `jobs_left`), then record it and tell
    Optuna; a job that ended without a record fails the trial, queued again."""
    tid, phase = _tid(t), t.user_attrs.get("phase", "search")
    plan = t.user_attrs.get("plan")
    with recorder.holding(t.number, tid, phase, plan):
        on_event("note", {"text": f"trial {tid}: launched by a tuner that stopped, and "
                                  "its job may still run: waiting for it"})
        on_event("start", {"trial_id": tid, "plan": plan or {}, "phase": phase,
                           "duplicate": False})
        result = rejoin_trial_job(run, tid, deadline, should_stop)
        if result is not None:
            recorder.record_then_tell(result, t.number)
        else:
            recorder.storage.set_trial_state_values(recorder.storage_id(t.number),
                                                    state=TrialState.FAIL)
            result, note = _dead(run.store, recorder.optuna_study, retries, t, "the tuner "
                                 "running this trial{who} stopped, and its job ended without "
                                 "a record")
            on_event("note", {"text": note})
    on_event("end", result.to_dict())
    return result


def settle(optuna_study: optuna.Study, store: RunStore, recorder: Recorder,
           measured: Measured, retries: int) -> list[str]:
    """Before each trial: fail (and retry) the trials of workers that died."""
    fail_stale_trials(optuna_study, recorder.storage)  # RDB heartbeats: calls StaleTrials
    return recover(optuna_study, store, recorder, measured, retries)


def _by_number(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {n: r for r in records if isinstance(n := tags_of(r).get("optuna_number"),
                                                  int)}


def _recorded(store: RunStore, running: list[FrozenTrial]) -> bool:
    numbers = {t.number for t in running}
    return any(n in numbers for n in _by_number(store.records()))


def _abandoned(t: FrozenTrial) -> bool:
    owner = Worker.parse(t.user_attrs.get("worker"))
    if owner is not None:
        return not owner.alive()
    # No owner yet: killed between ask and tagging, or a worker that has just asked.
    age = time.time() - t.datetime_start.timestamp() if t.datetime_start else 0.0
    return age > UNTAGGED_GRACE_S


def wait_for_untagged(optuna_study: optuna.Study, say: Callable[[str], None]) -> float:
    """On --resume: wait until the RUNNING trials without an owner tag are older than
    UNTAGGED_GRACE_S, so that `recover` can tell a trial whose tuner was killed between
    Optuna's ask and its tag (settled then) from one another worker has just asked
    (tagged by then). Seconds waited; 0 when there is none (the usual case)."""
    running = optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    young = [t for t in running if Worker.parse(t.user_attrs.get("worker")) is None
             and t.datetime_start is not None and not _abandoned(t)]
    if not young:
        return 0.0
    last = max(t.datetime_start.timestamp() for t in young)
    wait = max(0.0, last + UNTAGGED_GRACE_S - time.time()) + 1.0
    say(f"{len(young)} trial(s) RUNNING with no worker's tag, started moments ago: a tuner "
        "killed between Optuna's ask and its tag, or a worker that has just asked; waiting "
        f"{wait:.0f} s to tell which")
    _sleep(wait)
    return wait


def _settle_one(optuna_study: optuna.Study, store: RunStore, recorder: Recorder,
                measured: Measured, retries: int, t: FrozenTrial,
                record: dict | None) -> str | None:
    note = None
    if record is None and (found := _result_json(store, t)) is not None:
        store.append(found)
        record = found.to_dict()
        note = f"trial {_tid(t)}: finished before its tuner stopped; recorded"
    if record is not None:
        try:
            recorder.tell(t.number, record)
        except UpdateFinishedTrialError:  # another worker told it
            return None
        measured.remember(record)
        if tags_of(record).get("unreachable"):  # its worker could not queue it
            retry = may_retry(t, retries)
            if retry:
                queue_retry(optuna_study, t)
            words = "queued to run again" if retry else "not run again (retries spent)"
            return f"trial {_tid(t)}: its worker stopped when the storage went away; {words}"
        return note
    try:  # claim it: of several workers noticing, one sets FAIL
        recorder.storage.set_trial_state_values(recorder.storage_id(t.number),
                                                state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        return None
    torn = next((u for u in store.kept() if _was_record_of(store, u, t)), None)
    cause = (f"record torn ({_literal(torn.where())}): the tuner running this trial{{who}} "
             "stopped while writing it") if torn else \
        "the tuner running this trial{who} stopped before it ended"
    return _dead(store, optuna_study, retries, t, cause)[1]


def repair_records(store: RunStore, optuna_study: optuna.Study, measured: Measured,
                   retries: int) -> list[str]:
    """Cut trials.jsonl's unreadable lines out and settle the finished trials they
    were (see the module's doc); returns what was done, in words (each cut line
    named). RUNNING ones are `recover`'s."""
    notes = [u.describe() for u in store.repair()]
    kept = store.kept()
    if not kept:
        return notes
    with store.locked("settle"):
        records = store.records()
        numbers = set(_by_number(records))
        ids = {str(r.get("trial_id")) for r in records}
        finished = [t for t in optuna_study.get_trials(deepcopy=False)
                    if t.state.is_finished()]
        for u in kept:
            for t in (t for t in finished if _was_record_of(store, u, t)):
                if t.number in numbers or str(_tid(t)) in ids:
                    continue  # settled already
                notes.append(_settle_torn(store, optuna_study, measured, retries, t, u))
                numbers.add(t.number)
                ids.add(str(_tid(t)))
    return notes


def _settle_torn(store: RunStore, optuna_study: optuna.Study, measured: Measured,
                 retries: int, t: FrozenTrial, u: Unreadable) -> str:
    found = _result_json(store, t)
    if found is not None:
        store.append(found)
        measured.remember(found.to_dict())
        return (f"trial {_tid(t)}: its record was torn ({u.where()}); recorded again from "
                "its result.json")
    return _dead(store, optuna_study, retries, t,
                 f"record torn ({_literal(u.where())}), and no result.json",
                 again=not _retried(optuna_study, t))[1]


def _was_record_of(store: RunStore, u: Unreadable, t: FrozenTrial) -> bool:
    """Whether the cut line `u` may have been trial `t`'s record: by the Optuna number or
    trial id in its bytes; bytes cut before either may be any finished trial's that ran
    from this folder."""
    tid, number = u.trial()
    if number is not None:
        return t.number == number
    if tid is not None:
        return str(_tid(t)) == tid
    return t.state.is_finished() and store.trial_dir(_tid(t)).is_dir()


def _result_json(store: RunStore, t: FrozenTrial) -> TrialResult | None:
    """Trial `t`'s result.json, tagged as its record would have been; None where it
    was never (or not readably) written."""
    path = store.trial_dir(_tid(t)) / "result.json"
    try:
        found = read_result(path) if path.is_file() else None
    except (OSError, ValueError, TypeError):
        return None
    if found is not None:
        found.tags = {**found.tags, "phase": t.user_attrs.get("phase", "search"),
                      "optuna_number": t.number}
    return found


def _tid(t: FrozenTrial) -> int | str:
    return t.user_attrs.get("trial_id", t.number)


def _literal(text: str) -> str:
    """`text` safe inside a cause that `_dead` formats (it names the worker with {who})."""
    return text.replace("{", "{{").replace("}", "}}")


class StaleTrials:
    """The storage's stale-trial callback: Optuna has failed `trial` (no heartbeat for
    `grace`); record it as failed and queue its configuration again. Made before the
    storage (it is given to it), so it needs nothing that the storage makes."""

    def __init__(self, store: RunStore, retries: int, grace: str | float,
                 on_event: Callable[[str, dict[str, Any]], None]):
        self.store, self.retries, self.grace, self.on_event = store, retries, grace, on_event

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        note = _dead(self.store, study, self.retries, trial, "the worker running this "
                     f"trial{{who}} sent no heartbeat for {self.grace}", stale=True)[1]
        self.on_event("note", {"text": note})


def _dead(store: RunStore, optuna_study: optuna.Study, retries: int, t: FrozenTrial,
          cause: str, again: bool = True, **tags: object) -> tuple[TrialResult, str]:
    """A finished trial (FAIL already) that never got its record: a `failed` record,
    its configuration queued again (unless `again` is False or its retries are spent),
    and what was done, in words. `cause` may name the worker with {who}."""
    retry = again and may_retry(t, retries)
    owner = Worker.parse(t.user_attrs.get("worker"))
    cause = cause.format(who=f" ({owner.describe()})" if owner else "")
    words = ("queued to run again" if retry else
             "not run again (retries spent)" if again else "not run again")
    started = t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else ""
    record = failed_record(
        store, optuna_study.study_name, _tid(t), t.user_attrs.get("plan"), started, {
            "phase": t.user_attrs.get("phase", "search"), "optuna_number": t.number,
            "orphan": True, **tags}, f"{cause}; {words}")
    store.append(record)
    if retry:
        queue_retry(optuna_study, t)
    return record, f"trial {_tid(t)}: {cause}; marked failed, {words}"


def may_retry(t: FrozenTrial, retries: int) -> bool:
    """Whether the failed trial's configuration runs again: not when it ran
    `retries` + 1 times already (storage.retries), nor for an ablation trial (the
    ablation runs its own again)."""
    if not t.params or t.user_attrs.get("phase") == "ablation":
        return False
    return len(t.user_attrs.get("retry_history", [])) < retries


def _retried(optuna_study: optuna.Study, t: FrozenTrial) -> bool:
    """Whether trial `t`'s configuration was queued to run again already."""
    return any(t.number in (other.user_attrs.get("retry_history") or [])
               for other in optuna_study.get_trials(deepcopy=False))


def queue_retry(optuna_study: optuna.Study, t: FrozenTrial) -> None:
    optuna_study.enqueue_trial(t.params, user_attrs={
        "phase": t.user_attrs.get("phase", "search"),
        RETRY_OF: t.user_attrs.get(RETRY_OF, t.number),
        "retry_history": [*t.user_attrs.get("retry_history", []), t.number]})
