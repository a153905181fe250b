"""The database goes away at each step of a trial, for longer than the study's patience:
the worker stops (exit 3), and once the server is back `--resume` leaves every trial
in the storage finished with exactly one record in trials.jsonl.

The outage starts from a hook at the exact step (no timing), on a throwaway
PostgreSQL server (tests/pg_server.py), with `harness tune` in this process and the
fake launcher (tests/tuner/fake_launch.py). The first run's worker is given the
identity of a process that has ended, as a stopped worker's would be on --resume.
"""

from __future__ import annotations

from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

from tests.pg_server import postgres  # noqa: F401  (the fixture)
from tests.tuner import fake_launch
from tests.tuner.conftest import records, tune, write_study
from training_harness.records.run_store import RunStore
from training_harness.tune.recorder import Recorder
from training_harness.tune.recovery import resume
from training_harness.tune.storage import PatientStorage
from training_harness.tune.workers import Worker

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(240)]

QUICK = {"heartbeat": "1s", "grace": "5s", "patience": "1s"}
# Trials 0 and 1 are the queued references (ask() claims them), 2 on are the sampler's
# (ask() creates them).
STEPS = [
    ("claimed", 1),  # inside ask(): a queued trial just claimed, RUNNING, no tag yet
    ("created", 2),  # inside ask(): a new trial just created
    ("asked", 2),  # ask() has returned
    ("tagged", 2),  # the worker tag is written
    ("running", 2),  # the trial runs (its step throughputs go to the storage)
    ("recorded", 2),  # the record is in trials.jsonl, Optuna not told yet
    ("ablation-started", None),  # the first ablation trial is RUNNING in the storage
    ("ablation-recorded", None),  # its record is in trials.jsonl, Optuna not told yet
]


def storage_trials(url: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name="quickstart", storage=storage).get_trials()
    finally:
        storage.engine.dispose()


def outage_at(step: str, number: int, server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop the server once, right after `step` of trial `number` (see STEPS)."""
    stopped = []

    def stop(now: bool) -> None:
        if now and not stopped:
            stopped.append(step)
            server.stop("fast")

    claims = []
    set_state, create = PatientStorage.set_trial_state_values, PatientStorage.create_new_trial

    def claiming(self, trial_id, state, values=None):
        claimed = set_state(self, trial_id, state, values)
        if step == "claimed" and state == TrialState.RUNNING and claimed:
            claims.append(trial_id)
            stop(len(claims) == number + 1)
        return claimed

    def creating(self, study_id, template_trial=None):
        trial_id = create(self, study_id, template_trial)
        stop(step == "created" and template_trial is None)  # ask()'s, not a queued one
        return trial_id

    ask, set_attr, launch = optuna.Study.ask, optuna.Trial.set_user_attr, fake_launch.launch

    def asking(self, *a, **kw):
        trial = ask(self, *a, **kw)
        stop(step == "asked" and trial.number == number)
        return trial

    def tagging(self, key, value):
        set_attr(self, key, value)
        stop(step == "tagged" and key == "worker" and self.number == number)

    def launching(prep, out_dir, command, **kw):
        stop(step == "running" and kw.get("trial_id") == number)
        return launch(prep, out_dir, command, **kw)

    append = RunStore.append

    def appending(self, record):
        append(self, record)
        tags = (record if isinstance(record, dict) else record.to_dict())["tags"]
        stop(step == "recorded" and tags.get("optuna_number") == number
             or step == "ablation-recorded" and tags.get("phase") == "ablation")

    start_trial = Recorder.start_trial

    def starting(self, *a, **kw):
        started = start_trial(self, *a, **kw)
        stop(step == "ablation-started")
        return started

    monkeypatch.setattr(PatientStorage, "set_trial_state_values", claiming)
    monkeypatch.setattr(PatientStorage, "create_new_trial", creating)
    monkeypatch.setattr(optuna.Study, "ask", asking)
    monkeypatch.setattr(optuna.Trial, "set_user_attr", tagging)
    monkeypatch.setattr(fake_launch, "launch", launching)
    monkeypatch.setattr(RunStore, "append", appending)
    monkeypatch.setattr(Recorder, "start_trial", starting)
    me = Worker.this()
    gone = Worker(me.host, me.pid, me.created - 100)  # its pid, since taken by another
    monkeypatch.setattr(Worker, "this", classmethod(lambda cls: gone))


@pytest.mark.parametrize("step, number", STEPS, ids=[s for s, _ in STEPS])
def test_an_outage_at_any_step_leaves_one_record_per_trial(tmp_path, postgres, monkeypatch,  # noqa: F811
                                                            step, number):
    out = tmp_path / "run"
    ablation = step.startswith("ablation")
    # (the confirmation rounds run their trials as the ablation does: ExtraTrials.run_trial)
    # (random: TPE's studies queue the estimator's guesses after the two references)
    path = write_study(tmp_path, budget={"ablation_repeats": int(ablation), "n_trials": 4,
                                         "confirm_repeats": 0}, storage=QUICK, sampler="random")
    with monkeypatch.context() as patched:
        outage_at(step, number, postgres, patched)
        assert tune(str(path), "--out", str(out), "--storage", postgres.url) == 3
    before = (out / "trials.jsonl").read_text()

    postgres.start()
    # the claimed trial has no worker's tag: --resume waits out its grace (a minute; a
    # second here) before settling it, as tests/tuner/test_kill_9_moments.py does
    monkeypatch.setattr(resume, "UNTAGGED_GRACE_S", 1.0)
    assert tune("--resume", "--out", str(out), "--storage", postgres.url) == 0
    recs = records(out)
    assert (out / "trials.jsonl").read_text().startswith(before)  # nothing lost or rewritten
    trials = [t for t in storage_trials(postgres.url) if t.state != TrialState.WAITING]
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    counts = Counter(r["tags"]["optuna_number"] for r in recs)
    assert counts == Counter(t.number for t in trials)  # each trial: one record, no other
    states = {t.number: t.state for t in trials}
    if ablation:
        cut = [r for r in recs if r["tags"]["phase"] == "ablation" and r["status"] != "ok"]
        if step == "ablation-started":  # failed, and run again by the resumed ablation
            assert [r["tags"].get("unreachable") for r in cut] == [True], cut
            again = f"{cut[0]['trial_id']}-retry1"
            assert any(r["trial_id"] == again and r["status"] == "ok" for r in recs)
        else:
            assert cut == [] and '"phase": "ablation"' in before
        return
    hit = next(r for r in recs if r["tags"]["optuna_number"] == number)
    if step == "recorded":
        assert hit["status"] == "ok" and f'"optuna_number": {number}' in before  # first run's
        assert states[number] == TrialState.COMPLETE
    else:
        assert hit["status"] == "failed" and hit["tags"]["orphan"], hit
        # a trial the worker knew it held says why; one it never saw (created inside
        # ask()) is its stopped worker's, settled on --resume
        assert bool(hit["tags"].get("unreachable")) == (step != "created"), hit
        assert states[number] == TrialState.FAIL
