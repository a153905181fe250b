"""The launcher on the CPU with gloo: every trial in its own processes, every failure a record.

Each 2-rank trial takes a few seconds (torchrun, two interpreters importing
torch, a gloo group); the launcher picks a free port for each one.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.distributed.launch_helpers import (
    assert_nothing_left,
    faulty_plan,
    in_repo_root,  # noqa: F401  (a fixture)
    launch_plan,
)
from training_harness.records.result import read_result

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_repo_root")]


def rank_logs(out):
    """Each rank's stderr.log, by the rank its first line names."""
    logs = {}
    for path in (out / "logs").rglob("stderr.log"):
        first = path.read_text().splitlines()[0]
        logs[int(first.split(" rank ")[1].split()[0])] = path.read_text()
    return logs


@pytest.mark.timeout(120)
def test_single_process_trial_runs_in_a_child(tmp_path):
    out = tmp_path / "one"
    result = launch_plan(faulty_plan(world=1), out, "test")
    assert result.status == "ok", result.reason
    assert result.metrics["step_time_s"]["n"] == 3
    assert [r["rank"] for r in result.metrics["per_rank"]] == [0]
    assert read_result(out / "result.json").to_dict() == result.to_dict()
    # It ran in another process: the worker names its pid in its log.
    header = (out / "logs" / "rank0" / "stderr.log").read_text().splitlines()[0]
    assert header.startswith("harness worker: rank 0 of 1")
    assert f"pid {os.getpid()}" not in header
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_single_process_that_dies_is_a_failed_record(tmp_path):
    out = tmp_path / "dies"
    result = launch_plan(faulty_plan(world=1, exit_rank=0), out, "test")
    assert result.status == "failed"
    assert "exit code 3" in result.reason and "wrote no record" in result.reason
    assert result.predicted is not None and result.env["torch"]
    assert read_result(out / "result.json").status == "failed"
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_two_ranks_ddp(tmp_path):
    out = tmp_path / "ddp"
    plan = faulty_plan()
    result = launch_plan(plan, out, "test")
    assert result.status == "ok", result.reason
    m = result.metrics
    per_rank = m["per_rank"]
    assert [r["rank"] for r in per_rank] == [0, 1]
    assert all(r["host"] and r["step_time_median_s"] > 0 and r["peak_memory_bytes"] > 0
               for r in per_rank)
    # The job's figures: the slowest rank's step, the largest peak, the whole batch.
    assert m["step_time_s"]["n"] == 3
    assert m["step_time_s"]["median"] >= max(r["step_time_median_s"] for r in per_rank)
    assert m["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in per_rank)
    # Throughput from the measured window, the slowest rank's: one sync at each end.
    window = m["window"]
    assert window["seconds"] == max(r["window_s"] for r in per_rank)
    assert window["steps"] == 3 and window["source"] == "perf_counter"
    assert m["samples_per_s"] == pytest.approx(plan.batch_size * 3 / window["seconds"])
    # The recorded loss is the mean of the two ranks' (each its half of the batch).
    assert m["loss"]["finite"] and len(m["loss"]["values"]) == 4
    assert "ddp: 2 data ranks" in " ".join(m["notes"])
    assert set(rank_logs(out)) == {0, 1}
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_a_rank_that_raises_fails_the_trial(tmp_path):
    out = tmp_path / "raises"
    result = launch_plan(faulty_plan(fail_rank=1), out, "test")
    assert result.status == "failed"
    first = result.reason.splitlines()[0]
    assert first == "rank 1 failed: RuntimeError: injected failure on rank 1 at step 0"
    assert "last lines of its stderr" in result.reason
    assert "faulty_workload.py" in result.metrics["stderr_tail"]
    assert set(result.metrics["logs"]) == {"0", "1"}
    assert result.predicted is not None
    assert read_result(out / "result.json").status == "failed"
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_a_rank_out_of_memory_is_oom(tmp_path):
    out = tmp_path / "oom"
    result = launch_plan(faulty_plan(oom_rank=1), out, "test")
    assert result.status == "oom"
    assert result.reason.startswith("out of memory on rank 1: OutOfMemoryError: CUDA out of")
    assert_nothing_left(out)


@pytest.mark.timeout(120)
def test_a_nan_loss_on_one_rank_stops_both(tmp_path):
    out = tmp_path / "nan"
    result = launch_plan(faulty_plan(nan_at_step=2, nan_rank=1, steps=5), out, "test")
    assert result.status == "diverged"
    assert result.reason == "loss became non-finite at step 2 on rank 1"
    loss = result.metrics["loss"]
    assert len(loss["values"]) == 3 and loss["finite"] is False
    assert math.isfinite(loss["values"][1]) and loss["values"][2] == "nan"
    per_rank = {r["rank"]: r for r in result.metrics["per_rank"]}
    assert per_rank[1]["loss_last"] == "nan" and math.isfinite(per_rank[0]["loss_last"])
    # Both ranks stopped at the same step and finished cleanly.
    for text in rank_logs(out).values():
        assert "finished: diverged" in text
    assert_nothing_left(out)


# The real clock: it waits out its 20 s timeout (test_rank_server.py: a jumped clock).
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hang_times_out_and_nothing_is_left(hung_two_ranks):
    # The trial (tests/distributed/conftest.py) is shared with test_fork_ranks.py.
    # The rank hangs for ever: a launcher that did not stop it fails on the test's timeout
    # (no wall-clock assertion: a busy machine would make one flaky).
    result, out = hung_two_ranks.result, hung_two_ranks.out
    timeout = hung_two_ranks.timeout
    assert result.status == "timeout"
    assert result.reason.startswith(f"no result after {timeout:g} s; the trial was stopped")
    assert "ranks still running: 0, 1" in result.reason
    # Where each was: rank 1 in the hanging loss, from the stack each rank wrote when
    # the launcher asked, before stopping them.
    assert "rank 1 in loss at faulty_workload.py" in result.reason
    stack = (out / "logs" / "stack-rank1.txt").read_text()
    assert "in loss" in stack and "Current thread" in stack
    assert result.metrics["ranks_running"] == [0, 1]
    assert json.loads((out / "result.json").read_text())["status"] == "timeout"
    assert_nothing_left(out)
