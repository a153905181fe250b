"""Studies shared on a real PostgreSQL server (tests/pg_server.py): several workers,
a worker killed mid-trial, the database restarted or gone, passwords kept out of
every file. Trials use the fake launcher (tests/tuner/fake_launch.py), so what is
tested is the tuner and the storage, in seconds."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

from tests.pg_server import PASSWORD, postgres  # noqa: F401  (the fixture)
from tests.tuner.conftest import (
    SEARCH_ONLY,
    measured,
    records,
    same_configuration,
    tune_process,
    write_study,
)
from training_harness.cli.main import main

# slow: each test runs several `harness tune` processes for 20-40 s (issue 35: the
# `-m "not slow"` edit-test loop within 5 minutes; the whole suite runs them all)
# timeouts: hang guards only, long enough for a 2-core machine at load 20, where a `harness
# tune` process takes over a minute to start (seen while four engineers ran tests)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]
# Grace is 5 heartbeats: a live worker on a loaded CI machine must not look dead.
FAST_HEARTBEAT = {"heartbeat": "1s", "grace": "5s"}


def storage_trials(url: str, name: str = "quickstart") -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    finally:
        storage.engine.dispose()


def launches(log) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for line in log.read_text().splitlines()] \
        if log.exists() else []


def wait_until(condition, proc, timeout=240, what="the condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = condition()
        if found:
            return found
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def finish(proc, timeout=180) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def assert_every_trial_recorded_once(out, url) -> list[dict]:
    recs = records(out)
    trials = [t for t in storage_trials(url) if t.state != TrialState.WAITING]
    assert max(Counter(str(r["trial_id"]) for r in recs).values()) == 1  # none twice
    assert sorted(r["tags"]["optuna_number"] for r in recs) == sorted(t.number for t in trials)
    assert all(t.state != TrialState.RUNNING for t in trials)
    return recs


def test_postgres_three_workers_and_a_killed_worker_retried(tmp_path, postgres):  # noqa: F811
    """Three `harness tune` processes as on three machines (a run folder and a host name
    each, one database); one is killed mid-trial: another notices its silence, records
    the trial failed and runs it again."""
    log = tmp_path / "launches.log"
    path = write_study(tmp_path, budget={**SEARCH_ONLY, "n_trials": 16},
                       storage=FAST_HEARTBEAT)

    def worker(i):
        # node1's trials last 60 s (it is killed in its first), so that the kill below lands
        # mid-trial however slowly a loaded machine polls the database (a 10-s trial ended,
        # and was recorded, between the poll that saw it running and the kill at load 10)
        # (the budget a cap: n_trials ends the study; at load 20 the workers' starts took
        # a minute of 3m and the estimator, timing a loaded machine, skipped trials)
        return tune_process(str(path), "--out", str(tmp_path / f"node{i}"), "--budget", "10m",
                            "--storage", postgres.url, "--quiet",
                            env={"FAKE_TRIAL_S": "60.0" if i == 1 else "2.0",
                                 "FAKE_LOG": str(log), "HARNESS_WORKER_HOST": f"node{i}",
                                 # node0's first trial waits for all three: the kill then
                                 # lands early, with trials left for the retry (a loaded
                                 # machine's late node1 was killed as the last trials ran,
                                 # and n_trials ended the study with the retry queued)
                                 "FAKE_WAIT_FOR_WORKERS": "3"})

    first = worker(0)
    wait_until(lambda: launches(log), first, what="the first trial")  # the study exists
    others = [worker(1), worker(2)]
    victim = others[0]

    def busy_on_node1():  # a trial node1 has launched (its run lasts 60 s) and not told:
        # killed before its launch (inside ask(), say) a trial has no configuration to retry
        launched = {t for t, pid in launches(log) if pid == str(victim.pid)}
        return [t.number for t in storage_trials(postgres.url)
                if t.state == TrialState.RUNNING
                and str(t.user_attrs.get("trial_id", t.number)) in launched]

    wait_until(lambda: str(others[1].pid) in {pid for _, pid in launches(log)}, others[1],
               what="node2 starting a trial")
    running = wait_until(busy_on_node1, victim, what="node1 running a trial")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    if (tmp_path / "node1" / "trials.jsonl").exists():  # killed mid-trial: not recorded
        assert running[0] not in {r["tags"]["optuna_number"]
                                  for r in records(tmp_path / "node1")}
    for proc in (first, others[1]):
        text = finish(proc)
        assert proc.returncode == 0, text

    recs = [r for i in range(3) for r in records(tmp_path / f"node{i}")]
    trials = [t for t in storage_trials(postgres.url) if t.state != TrialState.WAITING]
    assert max(Counter(r["tags"]["optuna_number"] for r in recs).values()) == 1  # none twice
    assert sorted(r["tags"]["optuna_number"] for r in recs) == sorted(t.number for t in trials)
    assert all(t.state != TrialState.RUNNING for t in trials)
    dead = next(r for r in recs if r["tags"]["optuna_number"] == running[0])
    assert dead["status"] == "failed" and dead["tags"]["stale"], dead
    assert "no heartbeat for 5s" in dead["reason"] and "queued to run again" in dead["reason"]
    retried = [r for r in recs if r["tags"].get("retry_of") == running[0]]
    assert len(retried) == 1 and measured(retried[0]), retried  # once, by another
    assert same_configuration(retried[0]["plan"], dead["plan"])
    ran = launches(log)
    assert max(Counter(t for t, _ in ran).values()) == 1  # no trial launched twice
    assert len({pid for _, pid in ran}) == 3  # all three workers ran trials
    assert {r["tags"]["optuna_number"] for r in records(tmp_path / "node1")} < \
        {t.number for t in trials}  # what node1 finished before it died is kept


@pytest.mark.parametrize("down_s", [3])
def test_chaos_postgres_restarted_mid_study_loses_nothing(tmp_path, postgres, down_s):  # noqa: F811
    out = tmp_path / "run"
    # The grace outlasts the outage: with 5 s, a trial whose heartbeats stopped while the
    # database was down 3 s, with 2 s more to restart it on a loaded machine, could be
    # declared dead and run again (the likely cause of this test's one failure, in a
    # loaded suite). The grace's own test: test_postgres_three_workers_and_a_killed_...
    path = write_study(tmp_path, budget={**SEARCH_ONLY, "n_trials": 10},
                       storage={**FAST_HEARTBEAT, "grace": "30s"})
    proc = tune_process(str(path), "--out", str(out), "--budget", "3m",
                        "--storage", postgres.url, env={"FAKE_TRIAL_S": "0.5"})
    wait_until(lambda: len(records(out)) >= 3 if (out / "trials.jsonl").exists() else 0,
               proc, what="three records")
    postgres.stop("fast")
    time.sleep(down_s)
    postgres.start()
    text = finish(proc)
    assert proc.returncode == 0, text
    assert "unreachable" in text and "reachable again" in text, text
    recs = assert_every_trial_recorded_once(out, postgres.url)
    assert len(recs) >= 10
    assert PASSWORD not in text


def test_chaos_postgres_gone_too_long_stops_clearly_then_resumes(tmp_path, postgres):  # noqa: F811
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={**SEARCH_ONLY, "n_trials": 12},
                       storage={**FAST_HEARTBEAT, "patience": "4s"})
    env = {"FAKE_TRIAL_S": "0.5"}
    proc = tune_process(str(path), "--out", str(out), "--budget", "3m", "--storage",
                        postgres.url, env=env)
    wait_until(lambda: len(records(out)) >= 2 if (out / "trials.jsonl").exists() else 0,
               proc, what="two records")
    postgres.stop("fast")
    text = finish(proc, timeout=120)
    assert proc.returncode == 3, text
    last = text.strip().splitlines()[-1]
    assert "unreachable for" in last and "--resume" in last, text
    assert PASSWORD not in text
    before = (out / "trials.jsonl").read_text()

    postgres.start()
    again = tune_process("--resume", "--out", str(out), "--budget", "3m", "--storage",
                         postgres.url, "--quiet", env=env)
    text = finish(again)
    assert again.returncode == 0, text
    assert (out / "trials.jsonl").read_text().startswith(before)  # nothing lost or rewritten
    assert_every_trial_recorded_once(out, postgres.url)


def test_postgres_password_is_in_no_file_the_study_writes(tmp_path, postgres, capsys):  # noqa: F811
    out = tmp_path / "run"
    # one confirmation round and one ablation repeat: each phase writes its files once
    path = write_study(tmp_path, budget={"ablation_repeats": 1, "confirm_repeats": 1,
                                         "n_trials": 5})
    proc = tune_process(str(path), "--out", str(out), "--budget", "2m", "--workers", "2",
                        "--storage", postgres.url,
                        env={"FAKE_TRIAL_S": "0.2", "FAKE_CAPTURE_ENV": "1"})
    text = finish(proc)
    assert proc.returncode == 0, text
    # `harness report` in this process: what it prints and writes is the same, without
    # a second interpreter importing pandas and plotly
    capsys.readouterr()
    code = main(["report", str(out), "--csv", "--json"])
    report = capsys.readouterr()
    assert code == 0, report.err
    assert PASSWORD not in text + report.out + report.err
    written = [p for p in out.rglob("*") if p.is_file()]  # report.html, .csv, .json too
    assert len(written) > 10
    for p in written:
        assert PASSWORD.encode() not in p.read_bytes(), f"the password is in {p}"
    assert "tuner:***@" in (out / "study.json").read_text()
