"""Studies on the local Slurm with trials in flight at once, resumed, and checked for storage.

Each `harness tune` runs as its own process with a timeout. The trials' workload
(tests/slurm/meet_workload.py) makes the tests independent of timing: two jobs that
must meet inside their first step can only both finish if they ran at once, and a
gate holds a job while its tuner is killed. HARNESS_QUIET_SHARE=1: two jobs on this
one 2-CPU node compete, and a trial measured again would be a job more to count.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import optuna
import pytest
import tomli_w
from optuna.trial import TrialState

from tests.slurm.conftest import queued
from tests.slurm.test_slurm_study import STUDY
from training_harness.records.tags import tags_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a tuner whose trials are real Slurm jobs: 10-60 s


def env() -> dict[str, str]:  # at call time: the fixture has set SLURM_CONF
    return {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_QUIET_SHARE": "1"}


def study_file(folder: Path, partition: str, meet_dir: Path, storage: dict | None = None,
               budget: dict | None = None, **workload) -> Path:
    table = {**STUDY, "cluster": {"launcher": "slurm", "partition": partition, "max_jobs": 2}}
    if storage:
        table["storage"] = storage
    table["budget"] = {**STUDY["budget"], "n_trials": 2, "confirm_repeats": 0,
                       "trial_timeout": "90s", **(budget or {})}
    table["workload"] = {"name": "tests.slurm.meet_workload:build", "meet_dir": str(meet_dir),
                         **workload}
    path = folder / "study.toml"
    path.write_text(tomli_w.dumps(table))
    return path


def tune(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training_harness", "tune", *args, "--quiet"],
                          cwd=ROOT,
                          env=env(), capture_output=True, text=True, timeout=timeout)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]


def launched(run: Path) -> list[dict]:
    return [r for r in records(run) if "cluster" in tags_of(r)]


def stopped_with_two_jobs_held(study: Path, run: Path, met: Path, sig: int, *args: str) -> int:
    """Start the tuner (with `args`), wait until both its jobs are held in their first
    step, send `sig`; its exit code."""
    tuner = subprocess.Popen([sys.executable, "-m", "training_harness", "tune", str(study), "--out",
                              str(run), "--quiet", *args], cwd=ROOT, env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             # a test run started in the background (`cmd &` in a
                             # script) ignores SIGINT, and a child inherits that
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        give_up = time.monotonic() + 180
        while not (met.exists() and len(list(met.iterdir())) == 2):
            assert tuner.poll() is None and time.monotonic() < give_up, "no two jobs started"
            time.sleep(0.5)
        tuner.send_signal(sig)
        return tuner.wait(timeout=120)
    finally:
        if tuner.poll() is None:
            tuner.kill()


@pytest.mark.timeout(300)
def test_ctrl_c_cancels_every_job_in_flight(slurm_partition, tmp_path):
    run, met = tmp_path / "run", tmp_path / "met"
    study = study_file(tmp_path, slurm_partition, met, meet=2, gate=str(tmp_path / "never"),
                       wait_s=200)
    assert stopped_with_two_jobs_held(study, run, met, signal.SIGINT) == 130
    assert not queued()  # both cancelled before the tuner ended
    assert not (run / "trials.jsonl").exists() or not records(run)  # --resume settles them


@pytest.mark.timeout(420)
def test_resume_waits_for_the_jobs_of_a_killed_tuner(slurm_partition, tmp_path):
    run, met, gate = tmp_path / "run", tmp_path / "met", tmp_path / "go"
    study = study_file(tmp_path, slurm_partition, met, meet=2, gate=str(gate), wait_s=200)
    # SIGKILL, as a lost login session: no clean-up at all
    assert stopped_with_two_jobs_held(study, run, met, signal.SIGKILL) == -signal.SIGKILL
    seen = sorted(p.name for p in met.iterdir())
    assert sorted(line.split()[0] for line in queued()) == seen  # the jobs outlived it
    assert not (run / "trials.jsonl").exists() or not records(run)
    gate.write_text("go\n")

    done = tune("--resume", "--out", str(run))
    assert done.returncode == 0, done.stdout + done.stderr
    recs = records(run)
    # Each trial has one record, from the job the killed tuner submitted: none run again.
    # And max_jobs = 2 keeps two trials in flight: each job's first step waited until
    # both had started it (meet = 2), so both ok means both ran at once.
    assert sorted(r["tags"]["cluster"]["job_id"] for r in recs if "cluster" in r["tags"]) == seen
    assert all(r["status"] == "ok" and not r["tags"].get("orphan") for r in recs), recs
    assert len({r["trial_id"] for r in recs}) == len(recs) == 2
    for r in recs:
        logs = run / "trials" / str(r["trial_id"]) / "logs"
        assert (logs / f"slurm-{r['tags']['cluster']['job_id']}-0.out").exists()
    assert (run / "best.toml").exists()


GRACE_S = 3  # storage.grace of the next test: a killed tuner's trials are stale past it


@pytest.mark.timeout(420)
def test_a_resume_past_grace_waits_for_a_claimed_job_and_cancels_a_failed_trials_job(
        slurm_partition, tmp_path):
    run, met, gate = tmp_path / "run", tmp_path / "met", tmp_path / "go"
    db = f"sqlite:///{tmp_path / 'study.db'}"  # an RDB storage: heartbeats, grace
    # The held jobs outlive any start of the resumed tuner on a loaded machine: only a
    # cancel ends the failed trial's job before the test does.
    study = study_file(tmp_path, slurm_partition, met, meet=2, gate=str(gate), wait_s=400,
                       storage={"heartbeat": "1s", "grace": f"{GRACE_S}s", "retries": 0},
                       budget={"time": "15m", "trial_timeout": "6m"})
    assert stopped_with_two_jobs_held(study, run, met, signal.SIGKILL,
                                      "--storage", db) == -signal.SIGKILL
    trial_of = {json.loads((d / "slurm" / "job.json").read_text())["jobs"][-1]["job_id"]:
                int(d.name) for d in (run / "trials").iterdir() if (d / "slurm").is_dir()}
    kept, failed = sorted(trial_of)
    assert sorted(line.split()[0] for line in queued()) == [kept, failed]
    time.sleep(GRACE_S + 1.5)  # no beat since the kill: both trials are stale now
    storage = optuna.storages.RDBStorage(db)
    try:  # as another worker's fail_stale_trials does (its record is in its own folder)
        number = trial_of[failed]
        trial = next(t for t in optuna.load_study(study_name=STUDY["name"], storage=storage)
                     .get_trials(deepcopy=False) if t.number == number)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    finally:
        storage.engine.dispose()
    gate.with_name(f"go.{kept}").write_text("go\n")  # the job still owed a wait may end
    assert failed in {line.split()[0] for line in queued()}  # held at its gate

    done = tune("--resume", "--out", str(run), "--storage", db)
    assert done.returncode == 0, done.stdout + done.stderr
    # The failed trial's job was cancelled (it would have waited 200 s at its gate), the
    # stale but unfailed trial's job was waited for and gave its record: nothing queued.
    assert not queued()
    states = subprocess.run(["squeue", "-h", "-t", "all", "-j", failed, "-o", "%T"],
                            capture_output=True, text=True).stdout.split()
    assert states == ["CANCELLED"], states
    recs = {r["tags"]["optuna_number"]: r for r in records(run)}
    assert set(recs) == {trial_of[kept]}, recs  # the failed one's record is the other's
    mine = recs[trial_of[kept]]
    assert mine["status"] == "ok" and mine["tags"]["cluster"]["job_id"] == kept, mine
    assert not mine["tags"].get("orphan")


@pytest.mark.timeout(180)
def test_a_run_folder_the_compute_nodes_cannot_see_is_one_line_and_exit_2(
        slurm_partition, tmp_path):
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -m (a mount namespace) to hide a folder from the node")
    private = tmp_path / "private"  # a tmpfs only the tuner sees: a login node's own disk
    private.mkdir()
    study = study_file(tmp_path, slurm_partition, tmp_path / "met", meet=1)
    script = (f"mount -t tmpfs none {private} && exec {sys.executable} -m training_harness tune "
              f"{study} --out {private / 'run'} --quiet")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "is not shared with the compute nodes" in err, err
    assert not (tmp_path / "met").exists()  # no trial ran


@pytest.mark.timeout(420)
def test_the_quickstart_study_on_slurm_with_max_jobs_2_ends_with_a_best_plan_and_a_report(
        slurm_partition, tmp_path):
    # The 3-minute study, shortened: the two references (at once), then one
    # round of the ablation (the whole 3 minutes were run by hand: see the commit log),
    # each trial 1 + 2 steps instead of 2 + 6 (what is checked is the flow through the
    # jobs, not what the steps measure).
    table = tomllib.loads((ROOT / "studies" / "quickstart.toml").read_text())
    table |= {"warmup_steps": 1, "steps": 2}
    table["cluster"] = {"launcher": "slurm", "partition": slurm_partition, "max_jobs": 2}
    table["budget"] |= {"n_trials": 2, "confirm_repeats": 0, "ablation_repeats": 1}
    study, run = tmp_path / "quickstart.toml", tmp_path / "run"
    study.write_text(tomli_w.dumps(table))
    done = tune(str(study), "--out", str(run), "--budget", "3m", timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = launched(run)
    assert {r["tags"]["phase"] for r in jobs} >= {"baseline", "ablation"}, jobs
    assert len({r["tags"]["cluster"]["job_id"] for r in jobs}) == len(jobs)
    for r in jobs:  # every launched trial a job of the partition, its output in logs/
        cluster = r["tags"]["cluster"]
        assert cluster["partition"] == slurm_partition, cluster
        assert r["status"] != "ok" or cluster["state"] == "COMPLETED", cluster
        logs = run / "trials" / str(r["trial_id"]) / "logs"
        assert (logs / f"slurm-{cluster['job_id']}-0.out").exists()
    assert (run / "best.toml").exists()
    report = subprocess.run([sys.executable, "-m", "training_harness", "report", str(run)],
                            cwd=ROOT,
                            env=env(), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and list(run.glob("*.html")), report.stderr
