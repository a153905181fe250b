"""Trials that span two nodes of a real Slurm (conftest's `two_nodes`: n1 and n2 on this
machine, one rank a node, gloo, torchrun's static rendezvous on the job's first node:
rank 0 on n1, rank 1 on n2, whichever node's task starts first).

One job a trial on both nodes; its record names the job, both nodes and each rank's
node, and its losses and gradients are those of the same plan on two ranks of one
machine. A rank that fails or hangs on the second node, or the second node dying,
ends as one record saying where; Ctrl-C leaves nothing queued or running. This
cluster keeps no accounting (no sacct), as many do not: every state came from squeue.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.distributed.launch_helpers import (
    TINY,
    assert_nothing_left,
    faulty_plan,
    in_repo_root,  # noqa: F401  (a fixture)
    needs_ddp,
)
from tests.faulty_workload import HANG_MARK_ENV
from training_harness.cli.main import main
from training_harness.core.cluster import ClusterSpec
from training_harness.core.plan import Plan
from training_harness.launch import local, slurm
from training_harness.measure.prepare import prepare
from training_harness.records.result import read_result

pytestmark = [pytest.mark.slow, pytest.mark.distributed,
              pytest.mark.usefixtures("in_repo_root")]

# The same sums in the same order on one machine or two: what differs is only how many
# threads each rank's matmuls use, which rounds float32 differently.
LOSS_RTOL = 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


def grads_plan(grads_dir, world: int = 2) -> str:
    needs_ddp()
    args = "\n".join(f"{k} = {v}" for k, v in TINY.items())
    return (f'name = "grads"\ndevice = "cpu"\nmicro_batch_size = 4\nwarmup_steps = 1\n'
            f"steps = 3\ntimeout_s = 120\n[layout]\ndata = {world}\n[strategies.ddp]\n"
            f'[workload]\nname = "tests.slurm.grads_workload:build"\n'
            f'grads_dir = "{grads_dir}"\ntie_weights = false\n{args}\n')


@pytest.mark.timeout(300)
def test_a_two_node_bench_is_one_job_on_both_nodes_and_matches_one_node(two_nodes, tmp_path,
                                                                          capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(grads_plan(tmp_path / "grads-2nodes"))
    out = tmp_path / "bench"
    assert main(["bench", str(plan), "--launcher", "slurm", "--nnodes", "2",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    record = read_result(out / "result.json")
    assert record.status == "ok", record.reason
    cluster = record.tags["cluster"]
    assert cluster["nodes"] == "n[1-2]" and cluster["node_names"] == ["n1", "n2"]
    # one rank a node, by node rank (SLURM_NODEID): rank 0 on the job's first node
    assert cluster["rank_nodes"] == ["n1", "n2"] and len(cluster["jobs"]) == 1
    assert cluster["state"] == "COMPLETED" and cluster["partition"] == two_nodes
    # The one job ran a task on each node, each node's launcher its rank.
    logs = out / "logs"
    for node, name in enumerate(["n1", "n2"]):
        said = (logs / f"slurm-{cluster['job_id']}-{node}.out").read_text()
        assert f"node {node} of 2 ({name} on " in said
        assert list((logs / f"node{node}").rglob("stderr.log"))
    assert [r["launched_node"] for r in record.metrics["per_rank"]] == [0, 1]
    # No accounting here: the job's end came from squeue alone.
    assert subprocess.run(["sacct", "-j", cluster["job_id"]], capture_output=True).returncode

    # The same plan on two ranks of this machine (forked from the rank server).
    (tmp_path / "here.toml").write_text(grads_plan(tmp_path / "grads-1node"))
    here_plan = Plan.from_toml(tmp_path / "here.toml")
    here = local.launch(prepare(here_plan).checked(), tmp_path / "here", "test")
    assert here.status == "ok", here.reason
    two, one = record.metrics["loss"]["values"], here.metrics["loss"]["values"]
    assert len(two) == len(one) == 4 and two == pytest.approx(one, rel=LOSS_RTOL)
    for rank in (0, 1):  # every rank steps with the same averaged gradients
        on_two = torch.load(tmp_path / "grads-2nodes" / f"rank{rank}.pt")
        on_one = torch.load(tmp_path / "grads-1node" / f"rank{rank}.pt")
        assert on_two.keys() == on_one.keys() and len(on_two) > 4
        for name in on_one:
            torch.testing.assert_close(on_two[name], on_one[name], rtol=GRAD_RTOL,
                                       atol=GRAD_ATOL, msg=name)
    assert_nothing_left(out)


@pytest.mark.timeout(180)
def test_a_rank_failing_on_the_second_node_is_a_failed_record_saying_where(two_nodes,
                                                                           tmp_path):
    # Rank 1 is the second node's (node rank 1: ranks 1..1). The trial's timeout is far
    # off: the record comes from the failure, not the clock.
    prepared = prepare(faulty_plan(fail_rank=1, timeout_s=150.0)).checked()
    out = tmp_path / "fail"
    result = slurm.launch(prepared, out, "test", nnodes=2,
                          cluster=ClusterSpec(launcher="slurm", partition=two_nodes))
    assert result.status == "failed"
    assert result.tags["cluster"]["rank_nodes"] == ["n1", "n2"]  # as each rank said
    first = result.reason.splitlines()[0]
    assert first == "rank 1 on node n2 failed: RuntimeError: injected failure on rank 1 at step 0"
    assert "injected failure" in result.metrics["stderr_tail"]
    assert result.metrics["failed_rank"]["node"] == "n2"
    assert "/logs/node1/" in result.metrics["failed_rank"]["logs"]
    assert read_result(out / "result.json").reason == result.reason
    assert_nothing_left(out)


@pytest.mark.timeout(180)
def test_a_rank_hanging_on_the_second_node_is_stopped_with_both_nodes_stacks(
        two_nodes, tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(HANG_MARK_ENV, str(marks))
    # 15 s: time for the ranks to start and reach the hang on a quiet machine; where they
    # did not (a loaded one), the same trial again with the 40 s they always had.
    for timeout in (15.0, 40.0):
        prepared = prepare(faulty_plan(hang_rank=1, timeout_s=timeout)).checked()
        out = tmp_path / f"hang-{timeout:g}s"
        result = slurm.launch(prepared, out, "test", nnodes=2,
                              cluster=ClusterSpec(launcher="slurm", partition=two_nodes))
        if (marks / "rank1").exists():
            break
    assert (marks / "rank1").exists(), "rank 1 never reached its hang: raise the timeout"
    assert result.status == "timeout", result.reason
    assert result.tags["cluster"]["state"] == "COMPLETED"  # the job's launchers stopped it
    stacks = result.metrics["stacks"]
    assert result.tags["cluster"]["rank_nodes"] == ["n1", "n2"]
    assert {k: v["node"] for k, v in stacks.items()} == {"0": "n1", "1": "n2"}
    assert "faulty_workload.py" in stacks["1"]["stack"] and "in loss" in stacks["1"]["where"]
    assert "rank 1 on n2 in loss at faulty_workload.py" in result.reason
    assert_nothing_left(out)


@pytest.mark.timeout(180)
def test_ctrl_c_leaves_nothing_queued_or_running_on_either_node(two_nodes, tmp_path,
                                                                monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(HANG_MARK_ENV, str(marks))
    prepared = prepare(faulty_plan(hang_rank=1, timeout_s=150.0)).checked()

    def interrupt_once_both_ranks_run():
        if (marks / "rank1").exists():  # rank 1 in its hang, rank 0 waiting for it
            raise KeyboardInterrupt
        return None

    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        slurm.launch(prepared, out, "test", nnodes=2, should_stop=interrupt_once_both_ranks_run,
                     cluster=ClusterSpec(launcher="slurm", partition=two_nodes))
    assert not slurm._in_flight  # and `two_nodes` finds the queue empty
    job = json.loads((out / "slurm" / slurm.JOB_FILE).read_text())["jobs"][-1]["job_id"]
    states = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"],
                            capture_output=True, text=True).stdout.split()
    assert states in (["CANCELLED"], []), states
    assert_nothing_left(out)  # no rank, launcher or torchrun on n1 or n2 (this machine)


@pytest.mark.timeout(240)
def test_a_node_dying_mid_trial_is_recorded_with_slurms_reason(two_nodes, two_node_slurm,
                                                                tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(HANG_MARK_ENV, str(marks))
    prepared = prepare(faulty_plan(hang_rank=1, timeout_s=150.0)).checked()
    out = tmp_path / "dies"
    cluster_dir = Path(two_node_slurm).parent
    killed: list[int] = []

    def kill_n2_once_its_rank_runs():  # n2's slurmd, and every process of the job on n2
        if not killed and (marks / "rank1").exists():
            job = json.loads((out / "slurm" / slurm.JOB_FILE).read_text())["jobs"][-1]["job_id"]
            slurmd = int((cluster_dir / "slurmd-n2.pid").read_text())
            for proc in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    env = proc.environ()
                    if proc.pid == slurmd or (env.get("SLURMD_NODENAME") == "n2"
                                              and env.get("SLURM_JOB_ID") == job):
                        proc.kill()
                        killed.append(proc.pid)
        return None

    try:
        result = slurm.launch(prepared, out, "test", nnodes=2,
                              should_stop=kill_n2_once_its_rank_runs,
                              cluster=ClusterSpec(launcher="slurm", partition=two_nodes))
        assert len(killed) >= 3  # slurmd, n2's task and its launcher's processes
        assert result.status == "failed"
        assert result.reason.startswith("node n2 stopped during the trial: its part of the job "
                                        "ended without a word")
        assert "Slurm now says n2: down* (Not responding)" in result.reason
        assert result.metrics["lost_nodes"] == {"n2": "down* (Not responding)"}
        assert result.tags["cluster"]["node_names"] == ["n1", "n2"]
        assert_nothing_left(out)
    finally:  # n2 back (ReturnToService=2: up again once its slurmd registers)
        subprocess.run(["/usr/sbin/slurmd", "-f", two_node_slurm, "-N", "n2"], check=True)
        for _ in range(240):
            state = subprocess.run(["sinfo", "-h", "-N", "-n", "n2", "-o", "%T"],
                                   capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.25)
        assert state == "idle", f"n2 did not come back: {state}"
