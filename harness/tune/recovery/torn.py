"""Records cut short: trials.jsonl's unreadable lines named, cut out, their trials settled.

A line of trials.jsonl that is not a record (power lost mid-write, a full disk, a
network file system, or a record an older harness glued onto a torn one) is cut
out when a tuner starts, --resume too (`RunStore.repair`: its bytes are copied
beside the file first, `trials.jsonl.torn-<byte>-line<N>`, and the line is named
with the file, its number and that copy). The file then parses whole.

Its trial is then settled once, as a trial whose record never came
(training_harness.tune.recovery.resume):

    RUNNING in Optuna         `recover` settles it as any trial of a stopped worker:
                              its result.json recorded, or a `failed` record (tag
                              orphan) whose reason begins "record torn", and the
                              configuration queued again (storage.retries)
    finished in Optuna,       its result.json recorded again where there is one;
    no record here            otherwise a `failed` record (tag orphan), reason
                              "record torn (...)", and the configuration queued
                              again, unless it was already

Which trial a line was is read from its bytes (its Optuna number, else its trial
id); bytes cut before either name the trials of this folder that finished with no
record. The copies stay, so a tuner stopped between the cut and the settling
settles on its next --resume; a settled trial has its record and is left alone.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from training_harness.records.result import read_result
from training_harness.records.run_store import RunStore, Unreadable
from training_harness.records.tags import tags_of
from training_harness.tune.recorder import Measured, failed_record
from training_harness.tune.recovery.resume import may_retry, queue_retry


def repair_records(store: RunStore, optuna_study: optuna.Study, measured: Measured,
                   retries: int) -> list[str]:
    """Cut trials.jsonl's unreadable lines out and settle the finished trials they
    were; returns what was done, in words (each cut line named)."""
    notes = [u.describe() for u in store.repair()]
    return notes + settle_torn(store, optuna_study, measured, retries)


def settle_torn(store: RunStore, optuna_study: optuna.Study, measured: Measured,
                retries: int) -> list[str]:
    """Each finished trial a cut line was, left without a record: recorded once (see
    the module's table). RUNNING ones are `recover`'s (resume.py)."""
    kept = store.kept()
    if not kept:
        return []
    notes = []
    with store.locked("settle"):
        records = store.records()
        numbers = {n for r in records if isinstance(n := tags_of(r).get("optuna_number"), int)}
        ids = {str(r.get("trial_id")) for r in records}
        trials = optuna_study.get_trials(deepcopy=False)
        for u in kept:
            for t in _named_by(store, u, trials):
                tid = str(t.user_attrs.get("trial_id", t.number))
                if t.number in numbers or tid in ids:
                    continue  # settled already
                notes.append(_settle(store, optuna_study, measured, retries, t, u))
                numbers.add(t.number)
                ids.add(tid)
    return notes


def _named_by(store: RunStore, u: Unreadable, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The finished trials line `u` may have been the record of."""
    finished = [t for t in trials if t.state.is_finished()]
    tid, number = u.trial()
    if number is not None:
        return [t for t in finished if t.number == number]
    if tid is not None:
        return [t for t in finished if str(t.user_attrs.get("trial_id", t.number)) == tid]
    # cut before it named its trial: the trials run from this folder with no record
    return [t for t in finished
            if store.trial_dir(t.user_attrs.get("trial_id", t.number)).is_dir()]


def _settle(store: RunStore, optuna_study: optuna.Study, measured: Measured, retries: int,
            t: FrozenTrial, u: Unreadable) -> str:
    tid = t.user_attrs.get("trial_id", t.number)
    path = store.trial_dir(tid) / "result.json"
    try:
        found = read_result(path) if path.is_file() else None
    except (OSError, ValueError, TypeError):
        found = None
    if found is not None:
        found.tags = {**found.tags, "phase": t.user_attrs.get("phase", "search"),
                      "optuna_number": t.number}
        store.append(found)
        measured.remember(found.to_dict())
        return f"trial {tid}: its record was torn ({u.where()}); recorded again from {path}"
    retry = may_retry(t, retries) and not _retried(optuna_study, t)
    words = "queued to run again" if retry else "not run again"
    started = t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else ""
    record = failed_record(
        store, optuna_study.study_name, tid, t.user_attrs.get("plan"), started,
        {"phase": t.user_attrs.get("phase", "search"), "optuna_number": t.number,
         "orphan": True}, f"record torn ({u.where()}), and no result.json; {words}")
    store.append(record)
    if retry:
        queue_retry(optuna_study, t)
    return f"trial {tid}: its record was torn ({u.where()}); marked failed, {words}"


def _retried(optuna_study: optuna.Study, t: FrozenTrial) -> bool:
    """Whether trial `t`'s configuration was queued to run again already."""
    return any(t.number in (other.user_attrs.get("retry_history") or [])
               for other in optuna_study.get_trials(deepcopy=False))
