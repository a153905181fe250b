"""Faults around the tuner (the default journal storage, the fake launcher): a worker
killed mid-trial, a run folder that stops taking writes. Each ends with every
finished trial in the storage and in trials.jsonl, no process left, and a clear
message. PostgreSQL's faults are in test_postgres.py, kill -9 of the tuner itself
and --resume in test_tune_processes.py."""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter

import psutil
import pytest
from optuna.trial import TrialState

from tests.tuner.conftest import (
    SEARCH_ONLY,
    measured,
    records,
    same_configuration,
    tune_process,
    write_study,
)
from tests.tuner.test_tune_processes import journal_trials, launches, wait_for_records

# slow: each test runs several `harness tune` processes for 20-40 s (issue 35: the
# `-m "not slow"` edit-test loop within 5 minutes; the whole suite runs them all)
# timeouts: hang guards only (a helper importing torch took over 90 s to start at load 20)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]


def test_chaos_kill_9_a_helper_worker_mid_trial(tmp_path):
    """`--workers 2`: both workers search one storage and no trial is run or recorded
    twice; the helper, killed mid-trial, has its trial recorded failed and run again by
    the other. (One study proves both: each is a tuner and a helper importing torch.)"""
    out, log = tmp_path / "run", tmp_path / "launches.log"
    path = write_study(tmp_path, budget={"ablation_repeats": 1, "confirm_repeats": 0,
                                         "n_trials": 10})
    main = tune_process(str(path), "--out", str(out), "--budget", "5m", "--workers", "2",
                        "--quiet", env={"FAKE_TRIAL_S": "1.0", "FAKE_LOG": str(log),
                                        "FAKE_WAIT_FOR_WORKERS": "2",  # the helper joins
                                        # and its trials last, so that the kill below lands
                                        # mid-trial however slowly a loaded machine polls
                                        "FAKE_HELPER_TRIAL_S": "30"})
    end, running, helper = time.monotonic() + 240, [], None
    while not running and time.monotonic() < end:  # a helper's trial well under way
        assert main.poll() is None, main.stdout.read()
        helpers = [p for p in psutil.Process(main.pid).children() if "--helper" in p.cmdline()]
        if helpers and (out / "optuna.journal").exists():
            helper = helpers[0]
            # launched by the helper (the launch log): its plan chosen and being measured
            launched = {line.split()[0] for line in (log.read_text().splitlines()
                                                     if log.exists() else [])
                        if line.split()[1:] == [str(helper.pid)]}
            running = [t.number for t in journal_trials(out / "optuna.journal")
                       if t.state == TrialState.RUNNING
                       and f"|{helper.pid}|" in t.user_attrs.get("worker", "")
                       and str(t.user_attrs.get("trial_id", t.number)) in launched]
        time.sleep(0.1)
    assert running, "the helper never ran a trial"
    helper.kill()
    text, _ = main.communicate(timeout=180)
    assert main.returncode == 0, text

    recs = records(out)
    trials = journal_trials(out / "optuna.journal")  # WAITING ones left out
    assert len(trials) == len(recs)
    assert max(Counter(str(r["trial_id"]) for r in recs).values()) == 1
    assert sorted(r["tags"]["optuna_number"] for r in recs) == [t.number for t in trials]
    assert all(t.state != TrialState.RUNNING for t in trials)
    workers = {t.user_attrs["worker"] for t in trials if t.user_attrs.get("phase") != "ablation"}
    assert len(workers) == 2  # both searched
    assert len({line.split()[1] for line in log.read_text().splitlines()}) == 2  # both ran
    assert any(r["tags"]["phase"] == "ablation" for r in recs)  # the final phase, once
    dead = next(r for r in recs if r["tags"]["optuna_number"] == running[0])
    assert dead["status"] == "failed" and "queued to run again" in dead["reason"], dead
    again = [r for r in recs if r["tags"].get("retry_of") == running[0]]
    assert len(again) == 1 and measured(again[0]), again
    assert same_configuration(again[0]["plan"], dead["plan"])
    assert max(Counter(launches(log)).values()) == 1
    assert not psutil.pid_exists(helper.pid)  # reaped; nothing left behind


def test_chaos_run_folder_stops_taking_writes_mid_study(tmp_path):
    """A file where the trial folders go: as a full disk or a lost mount would, the next
    trial cannot write its folder. (Tests run as root, so permissions cannot stop a
    write; a file in the way can.)"""
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={**SEARCH_ONLY, "n_trials": 8})
    env = {"FAKE_TRIAL_S": "0.4"}
    proc = tune_process(str(path), "--out", str(out), "--budget", "3m", env=env)
    wait_for_records(out, 2, proc)
    shutil.move(out / "trials", tmp_path / "trials-aside")
    (out / "trials").write_text("in the way\n")
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, text
    last = text.strip().splitlines()[-1]
    assert "cannot write" in last and "--resume" in last, text
    assert "Traceback" not in text
    finished = records(out)
    told = {t.number: t.state for t in journal_trials(out / "optuna.journal")}
    assert all(told[r["tags"]["optuna_number"]] == TrialState.COMPLETE for r in finished)

    (out / "trials").unlink()
    shutil.move(tmp_path / "trials-aside", out / "trials")
    again = tune_process("--resume", "--out", str(out), "--budget", "3m", "--quiet", env=env)
    text, _ = again.communicate(timeout=120)
    assert again.returncode == 0, text
    recs = records(out)
    assert recs[:len(finished)] == finished  # nothing lost or rewritten
    trials = journal_trials(out / "optuna.journal")
    assert all(t.state != TrialState.RUNNING for t in trials)
    assert sorted(r["tags"]["optuna_number"] for r in recs) == \
        sorted(t.number for t in trials if t.state != TrialState.WAITING)
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(out) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]
