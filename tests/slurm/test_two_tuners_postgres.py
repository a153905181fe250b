"""Two tuners on one PostgreSQL study, each submitting its trials as 2-node jobs to the
two-node cluster (conftest's `two_nodes`), as two login nodes would; one is killed
with kill -9 while its trial's job runs, and resumed.

Each tuner's trials are held by their workload (tests/slurm/held_workload.py): its
job waits inside the running job for a gate the test opens. So, without timing
anything: each tuner holds its trial, the killed tuner's job is still running when it
is killed, and its resumed tuner finds that job, waits for it (the test opens the gate
only once the resume has claimed the trial) and records it. Every Optuna trial ends
with exactly one record across the two run folders, no trial is run twice, the killed
tuner's folder keeps what it had, and nothing is left queued or running on either node.
(That a resume keeps the records a killed tuner had written, and runs none of their
trials again: tests/tuner/test_tune_processes.py's kill -9 test.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import psutil
import pytest
import tomli_w
from optuna.trial import TrialState

from tests.distributed.launch_helpers import TINY, assert_nothing_left, needs_ddp
from tests.pg_server import postgres  # noqa: F401  (the fixture)
from tests.slurm.conftest import queued

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
ROOT = Path(__file__).resolve().parents[2]

# ZeRO (stage 1 or 2) over the two data ranks, one a node; a grid of its two
# configurations, so that every trial is one job (no repeat of a measured one): one
# trial a tuner.
STUDY = {
    "name": "two-tuners", "device": "cpu", "global_batch_size": 8,
    "micro_batch_sizes": [4], "warmup_steps": 1, "steps": 2, "sampler": "grid",
    "layout": {"world_sizes": [2], "nnodes": 2},
    # Ceilings, not waits: on a loaded 2-core machine a resumed tuner took 2 minutes to
    # start and claim its held job, which a 2-minute trial_timeout had stopped by then.
    "budget": {"time": "15m", "trial_timeout": "5m", "n_trials": 2, "ablation_share": 0.0,
               "ablation_repeats": 0, "confirm_repeats": 0},
    # The killed tuner's trial beats no more: another tuner would fail it after `grace`.
    # The resume claims it long before that (seconds; minutes on a loaded machine).
    "storage": {"heartbeat": "2s", "grace": "6m"},
    "strategies": {"zero": {"search": ["stage"], "values": {"stage": [1, 2]}}},
}


def storage_trials(storage: optuna.storages.RDBStorage) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY["name"], storage=storage).get_trials(deepcopy=False)


def tuner(host: str, *args: str) -> subprocess.Popen:
    """`harness tune ARGS --quiet` as worker `host` (its jobs hold at hold/<host>/)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_WORKER_HOST": host,
           "HARNESS_QUIET_SHARE": "1"}  # four ranks share two cores: no measuring again
    return subprocess.Popen([sys.executable, "-m", "training_harness", "tune", *args, "--quiet"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_until(condition, procs, what: str, timeout: float = 240, pause: float = 0.25):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = condition()
        if found:
            return found
        for p in procs:
            assert p.poll() is None, p.communicate()[0]
        time.sleep(pause)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def jobs_held(folder: Path) -> list[str]:
    """The jobs of one tuner that reached their first batch, oldest first."""
    if not folder.is_dir():
        return []
    return [str(j) for j in sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())]


def records(run: Path) -> list[dict]:
    path = run / "trials.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


@pytest.mark.timeout(600)
def test_two_tuners_on_postgres_one_killed_and_resumed_lose_nothing(two_nodes, postgres,  # noqa: F811
                                                                     tmp_path):
    needs_ddp()
    held = tmp_path / "held"
    table = {**STUDY, "workload": {"name": "tests.slurm.held_workload:build",
                                   "hold_dir": str(held), "wait_s": 280.0, **TINY,
                                   "tie_weights": False},
             "cluster": {"launcher": "slurm", "partition": two_nodes, "max_jobs": 1}}
    study = tmp_path / "study.toml"
    study.write_text(tomli_w.dumps(table))
    run_a, run_b = tmp_path / "node0", tmp_path / "node1"
    a = tuner("node0", str(study), "--out", str(run_a), "--storage", postgres.url)
    b = tuner("node1", str(study), "--out", str(run_b), "--storage", postgres.url)
    procs = [a, b]
    try:
        # Each holds its trial inside a running job on n1 and n2.
        wait_until(lambda: len(jobs_held(held / "node0")) == 1 == len(jobs_held(held / "node1")),
                   procs, "both tuners holding their job")
        assert not records(run_b)
        launched = {p: p.read_text() for p in run_b.glob("trials/*/launched.json")}
        assert len(launched) == 1, launched
        job = jobs_held(held / "node1")[0]
        b.send_signal(signal.SIGKILL)  # no clean-up at all: a lost login session
        b.wait(timeout=30)
        assert job in {line.split()[0] for line in queued()}  # its job outlived it
        (held / "node0" / "go").write_text("go\n")  # the other tuner goes on

        resumed = tuner("node1", "--resume", "--out", str(run_b), "--storage", postgres.url)
        procs = [a, resumed]

        # One connection, asked twice a second: a new RDBStorage a poll (its engine, its
        # schema check) took a good part of a core from the jobs on this 2-core machine.
        storage = optuna.storages.RDBStorage(postgres.url)
        try:
            def claimed():  # the killed tuner's trial, now the resumed tuner's
                return [t for t in storage_trials(storage) if t.state == TrialState.RUNNING
                        and t.user_attrs.get("worker", "").startswith(f"node1|{resumed.pid}|")]

            rejoined = wait_until(claimed, [resumed], "the resumed tuner claiming its job",
                                  pause=0.5)
        finally:
            storage.engine.dispose()
        assert len(rejoined) == 1
        (held / "node1" / "go").write_text("go\n")  # only now may the job end
        for p in (a, resumed):
            out = p.communicate(timeout=240)[0]
            assert p.returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()

    recs = {"node0": records(run_a), "node1": records(run_b)}
    every = recs["node0"] + recs["node1"]
    storage = optuna.storages.RDBStorage(postgres.url)
    try:
        trials = storage_trials(storage)
    finally:
        storage.engine.dispose()
    assert all(t.state == TrialState.COMPLETE for t in trials), [t.state for t in trials]
    numbers = Counter(r["tags"]["optuna_number"] for r in every)
    assert sorted(numbers) == sorted(t.number for t in trials) and set(numbers.values()) == {1}
    assert len(trials) == 2 and all(r["status"] == "ok" for r in every), every
    assert len(recs["node0"]) == len(recs["node1"]) == 1
    # Recovered on resume: the job the killed tuner submitted gave the record; none run again.
    mine = next(r for r in recs["node1"] if r["tags"]["optuna_number"] == rejoined[0].number)
    assert mine["tags"]["cluster"]["job_id"] == job and not mine["tags"].get("orphan")
    assert not any(r["tags"].get("retry_of") is not None for r in every)
    ran = [r["tags"]["cluster"]["job_id"] for r in every]
    assert sorted(ran) == sorted(jobs_held(held / "node0") + jobs_held(held / "node1"))
    # The killed tuner's trial folder is the one the resume finished, as it was left.
    assert {p: p.read_text() for p in run_b.glob("trials/*/launched.json")} == launched
    for r in every:  # every trial one job of both nodes, ZeRO's data ranks one a node
        cluster = r["tags"]["cluster"]
        assert cluster["nodes"] == "n[1-2]" and cluster["node_names"] == ["n1", "n2"]
        assert cluster["rank_nodes"] == ["n1", "n2"]  # by node rank (SLURM_NODEID)
        assert len(cluster["jobs"]) == 1 and "zero" in r["plan"]["strategies"]
        assert r["plan"]["layout"]["data"] == 2
    assert sorted(r["plan"]["strategies"]["zero"]["stage"] for r in every) == [1, 2]

    assert not queued()
    left = []  # no process of these jobs on n1 or n2 (both are this machine)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("SLURM_JOB_ID") in ran:
                left.append((proc.pid, " ".join(proc.cmdline())[:120]))
    assert not left, left
    assert_nothing_left(tmp_path)
