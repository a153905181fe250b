"""Trials as jobs of a real Slurm (the local one of conftest.py), through submitit.

A trial run as a job gives the record the same trial gives on this machine, plus
where it ran; a job Slurm refuses is one line and exit 2 before anything runs; a
job that outlives its trial's timeout is cancelled; Ctrl-C takes the job along.
Every test leaves the queue empty (the `slurm_partition` fixture checks it).
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from tests.distributed.launch_helpers import (
    assert_nothing_left,
    faulty_plan,
    in_repo_root,  # noqa: F401  (a fixture)
)
from training_harness.core.cluster import ClusterSpec
from training_harness.launch import local, slurm
from training_harness.measure.prepare import prepare
from training_harness.records.result import read_result

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_repo_root")]


def shape_of(record: dict) -> dict:
    """What a record says about its trial, without the figures that differ run to run."""
    m = record["metrics"]
    return {
        "status": record["status"], "plan": record["plan"], "keys": sorted(record),
        "metric_keys": sorted(m), "steps": m["step_time_s"]["n"],
        "ranks": [r["rank"] for r in m["per_rank"]], "finite": m["loss"]["finite"],
        "loss": [m["loss"]["first"], m["loss"]["last"]],
    }


@pytest.mark.slow  # a real Slurm job: 5-20 s
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2])
def test_a_trial_as_a_job_gives_the_local_record(slurm_partition, tmp_path, world):
    prepared = prepare(faulty_plan(world=world)).checked()
    here = local.launch(prepared, tmp_path / "here", "test", study="s", trial_id=1)
    out = tmp_path / "job"
    job = slurm.launch(prepared, out, "test", study="s", trial_id=1,
                       cluster=ClusterSpec(launcher="slurm", partition=slurm_partition))
    assert here.status == "ok" and job.status == "ok", job.reason
    on_slurm, on_here = shape_of(job.to_dict()), shape_of(here.to_dict())
    # The same seed and data: the same losses (to rounding, should thread counts differ).
    assert on_slurm.pop("loss") == pytest.approx(on_here.pop("loss"), rel=1e-5)
    assert on_slurm == on_here
    assert job.to_dict() == read_result(out / "result.json").to_dict()
    cluster = job.tags["cluster"]
    assert cluster["launcher"] == "slurm" and cluster["partition"] == slurm_partition
    assert cluster["nodes"] == socket.gethostname() and cluster["state"] == "COMPLETED"
    assert cluster["queue_wait_s"] >= 0 and len(cluster["jobs"]) == 1
    job_out = out / "logs" / f"slurm-{cluster['job_id']}-0.out"
    host = socket.gethostname()
    assert f"node 0 of 1 ({host.split('.')[0]} on {host}): ok" in job_out.read_text()
    assert cluster["node_names"] == [host.split(".")[0]]
    assert cluster["rank_nodes"] == [host.split(".")[0]] * world
    assert (out / "logs" / f"slurm-{cluster['job_id']}-0.err").exists()
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_a_job_slurm_refuses_is_one_line_and_exit_2(slurm_partition, tmp_path, capsys):
    from training_harness.cli.main import main

    plan = tmp_path / "plan.toml"
    plan.write_text(faulty_plan(world=1).replace(
        cluster=ClusterSpec(launcher="slurm", partition="no-such-partition")).to_toml())
    out = tmp_path / "out"
    assert main(["bench", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "invalid partition" in err.lower() and "no-such-partition" in err
    assert not out.exists()  # nothing made, nothing submitted


@pytest.mark.slow  # a real Slurm job: 5-20 s
@pytest.mark.timeout(120)
def test_a_job_past_its_trial_timeout_is_cancelled(slurm_partition, tmp_path, monkeypatch):
    # The trial's own launcher in the job stops a hanging trial at its timeout (the local
    # launcher's tests show how); here the job's deadline comes first, as when the node
    # itself hangs: from the job's start, timeout + STARTUP_S = 20 - 15 = 5 s.
    monkeypatch.setattr(slurm, "STARTUP_S", -15.0)
    prepared = prepare(faulty_plan(world=1, hang_rank=0, timeout_s=20.0)).checked()
    out = tmp_path / "hang"
    result = slurm.launch(prepared, out, "test", cluster=ClusterSpec(launcher="slurm",
                                                                     partition=slurm_partition))
    assert result.status == "timeout"
    assert "ran past the trial's timeout" in result.reason and "scancel" in result.reason
    assert result.tags["cluster"]["jobs"][0]["stopped"] == "timeout"
    assert read_result(out / "result.json").status == "timeout"
    assert_nothing_left(out)


@pytest.mark.slow  # a real Slurm job: 5-20 s
@pytest.mark.timeout(120)
def test_a_hanging_trial_is_stopped_at_its_timeout_inside_the_job(slurm_partition, tmp_path):
    prepared = prepare(faulty_plan(world=1, hang_rank=0, timeout_s=4.0)).checked()
    out = tmp_path / "hang"
    result = slurm.launch(prepared, out, "test", cluster=ClusterSpec(launcher="slurm",
                                                                     partition=slurm_partition))
    assert result.status == "timeout", result.reason
    assert result.tags["cluster"]["state"] == "COMPLETED"  # the job ended by itself
    assert_nothing_left(out)


@pytest.mark.slow  # a real Slurm job: 5-20 s
@pytest.mark.timeout(120)
def test_stopped_early_is_pruned_and_ctrl_c_or_sigterm_cancels_the_job(slurm_partition, tmp_path):
    prepared = prepare(faulty_plan(world=1, hang_rank=0, timeout_s=60.0)).checked()
    cluster = ClusterSpec(launcher="slurm", partition=slurm_partition)
    calls = []

    def stop_on_third_call(then):
        def should_stop():
            calls.append(1)
            if len(calls) % 3 == 0:
                return then()
            return None
        return should_stop

    result = slurm.launch(prepared, tmp_path / "pruned", "test", cluster=cluster,
                          should_stop=stop_on_third_call(lambda: "slower than the best"))
    assert result.status == "pruned" and result.reason == "slower than the best"
    assert result.tags["cluster"]["state"] == "CANCELLED"

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        slurm.launch(prepared, tmp_path / "interrupted", "test", cluster=cluster,
                     should_stop=stop_on_third_call(interrupt))
    assert not slurm._in_flight  # and the `slurm_partition` fixture finds the queue empty
    assert_nothing_left(tmp_path / "interrupted")

    def terminated():  # as when the tuner's own job ends, or `scancel` stops it
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        slurm.launch(prepared, tmp_path / "terminated", "test", cluster=cluster,
                     should_stop=stop_on_third_call(terminated))
    assert signal.getsignal(signal.SIGTERM) is before and not slurm._in_flight


@pytest.mark.slow  # a real Slurm job: 5-20 s
@pytest.mark.timeout(180)
def test_a_job_whose_node_fails_is_submitted_once_more(slurm_partition, tmp_path):
    import subprocess

    from tests.slurm.conftest import queued

    node = socket.gethostname().split(".")[0]
    downed: list[str] = []

    def fail_the_node_once():  # called at each poll: down the node under the first job
        if not downed and any(line.endswith("RUNNING") for line in queued()):
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                            "reason=harness-test"], check=True)
            downed.append(node)
        elif downed:  # back for the second job (Slurm may have returned it already)
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                           capture_output=True)
        return None

    # The trial hangs, so the node fails under it; the second job's trial stops at its timeout.
    prepared = prepare(faulty_plan(world=1, hang_rank=0, timeout_s=4.0)).checked()
    try:
        result = slurm.launch(prepared, tmp_path / "retried", "test", should_stop=
                              fail_the_node_once, cluster=ClusterSpec(launcher="slurm",
                                                                      partition=slurm_partition))
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                       capture_output=True)
    jobs = result.tags["cluster"]["jobs"]
    assert [j["state"] for j in jobs] == ["NODE_FAIL", "COMPLETED"], jobs
    assert result.status == "timeout" and result.tags["cluster"]["job_id"] == jobs[1]["job_id"]
    assert_nothing_left(tmp_path / "retried")


@pytest.mark.timeout(120)
def test_a_job_refused_once_the_study_runs_is_a_failed_record(slurm_partition, tmp_path):
    # Checked up front, as bench and tune do, each is one line and exit 2; a partition or
    # a limit that changes while a study runs shows here.
    prepared = prepare(faulty_plan(world=1)).checked()
    gone = ClusterSpec(launcher="slurm", partition="gone")
    result = slurm.launch(prepared, tmp_path / "refused", "test", cluster=gone)
    assert result.status == "failed", result.reason
    assert result.reason == ("sbatch refused the trial's job: invalid partition specified: "
                             "gone; Batch job submission failed: Invalid partition name "
                             "specified")
    assert result.tags["cluster"]["job_id"] is None
    assert read_result(tmp_path / "refused" / "result.json").status == "failed"

    # sbatch takes a job larger than every node (unless the cluster enforces its limits
    # at submission), and it would wait for ever: it is cancelled and recorded.
    too_big = ClusterSpec(launcher="slurm", partition=slurm_partition, cpus_per_task=4096)
    result = slurm.launch(prepared, tmp_path / "never", "test", cluster=too_big)
    assert result.status == "failed" and "could never start" in result.reason
    assert "PartitionConfig" in result.reason and result.tags["cluster"]["state"] == "CANCELLED"
