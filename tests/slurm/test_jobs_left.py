"""Which leftover jobs a resumed tuner cancels (training_harness.tune.recovery.resume.
cancel_jobs_left), with a launcher that only counts: no Slurm, no trial run. A job is
cancelled only for a trial that is failed, whose worker is dead, that has no record
of its own here, and that left a job; every other trial's job is its owner's (or has
ended with its record)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from training_harness.launch.launcher import Launcher
from training_harness.records.result import TrialResult
from training_harness.records.run_store import RunStore
from training_harness.tune.recovery.resume import cancel_jobs_left
from training_harness.tune.trial_job import LAUNCHED, TrialRunner
from training_harness.tune.workers import Worker

DEAD = "this-host|1|1.00"  # replaced by this host's name below: pid 1 was not made then


class CountingLauncher(Launcher):
    may_leave_jobs = True

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def launch(self, prepared: Any, out_dir: str | Path, command: str,
               **kwargs: Any) -> TrialResult:
        raise AssertionError("nothing is launched here")

    def has_job(self, folder: str | Path) -> bool:
        return (Path(folder) / "job").is_file()

    def cancel_job(self, folder: str | Path) -> str | None:
        self.cancelled.append(Path(folder).name)
        return f"job of {Path(folder).name} cancelled"


def test_only_failed_dead_workers_trials_without_their_own_record_lose_their_job(tmp_path):
    store = RunStore(tmp_path / "run")
    store.create("")
    dead = DEAD.replace("this-host", Worker.this().host)
    assert not Worker.parse(dead).alive()
    study = optuna.create_study()
    dist = {"x": CategoricalDistribution([0, 1])}

    def trial(number: int, state: TrialState, worker: str, job: bool = True,
              record: dict | None = None) -> None:
        study.add_trial(optuna.trial.create_trial(
            state=state, params={"x": 0}, distributions=dist, value=None if state !=
            TrialState.COMPLETE else 1.0, user_attrs={"worker": worker, "trial_id": number}))
        folder = store.trial_dir(number)
        folder.mkdir(parents=True)
        (folder / LAUNCHED).write_text("{}")
        if job:
            (folder / "job").write_text("")
        if record is not None:
            store.append(TrialResult.not_measured(
                record["status"], "x", study="s", trial_id=number, plan={}, predicted=None,
                tags={"optuna_number": number, **record.get("tags", {})}))

    trial(0, TrialState.FAIL, dead)  # failed by another worker: no record here
    trial(1, TrialState.FAIL, dead, record={"status": "failed", "tags": {"orphan": True}})
    trial(2, TrialState.FAIL, dead, record={"status": "failed"})  # its own: the job ended
    trial(3, TrialState.FAIL, Worker.this().tag)  # its worker runs: its to end
    trial(4, TrialState.FAIL, dead, job=False)  # never a job
    trial(5, TrialState.COMPLETE, dead, record={"status": "ok"})
    launcher = CountingLauncher()
    run = TrialRunner("s", store, 0, None, None, launcher)  # type: ignore[arg-type]
    notes = cancel_jobs_left(study, run)
    assert launcher.cancelled == ["0", "1"]
    assert notes[0] == ("trial 0: failed while its tuner was stopped (another worker took it "
                        "for dead and queued it again): its job of 0 cancelled")
    assert cancel_jobs_left(study, TrialRunner("s", store, 0, None, None)) == []  # type: ignore[arg-type]


def test_a_launch_functions_cancel_job_attribute_is_honoured(tmp_path):
    from training_harness.launch.launcher import as_launcher

    def launch(prepared, out_dir, command, **kwargs):
        raise AssertionError("nothing is launched here")

    plain = as_launcher(launch)
    assert plain.cancel_job(tmp_path) is None  # the default: no job to cancel
    launch.cancel_job = lambda folder: f"cancelled {Path(folder).name}"  # type: ignore[attr-defined]
    assert as_launcher(launch).cancel_job(tmp_path / "3") == "cancelled 3"


def test_the_slurm_launcher_cancels_nothing_where_no_job_was_submitted(tmp_path):
    import json

    from training_harness.core.cluster import ClusterSpec
    from training_harness.launch.slurm import JOB_FILE, SlurmLauncher

    launcher = SlurmLauncher(ClusterSpec(launcher="slurm"))
    assert launcher.cancel_job(tmp_path) is None  # no slurm/job.json: never submitted
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / JOB_FILE).write_text(json.dumps({"job": {}, "jobs": [
        {"job_id": None, "state": "NOT_SUBMITTED", "nodes": "", "stopped": None}]}))
    assert launcher.cancel_job(tmp_path) is None  # sbatch refused it: nothing runs
