"""One-rank trials forked from the rank server (training_harness.launch.rank_server): each a
fresh process, stopped at its timeout like any other, and gone afterwards."""

from __future__ import annotations

import json
import os

import pytest

from tests.distributed.launch_helpers import (  # noqa: F401  (fixture)
    assert_nothing_left,
    faulty_plan,
    in_repo_root,
    launch_plan,
    timeout_once_hung,
)
from training_harness.launch import rank_server

pytestmark = [pytest.mark.usefixtures("in_repo_root"),
              pytest.mark.skipif(not rank_server.enabled(), reason="no forkserver here")]


def _pid(out) -> int:
    header = (out / "logs" / "rank0" / "stderr.log").read_text().splitlines()[0]
    return int(header.rsplit("pid ", 1)[1])


@pytest.mark.timeout(180)
def test_every_trial_is_a_new_fork_of_the_server(tmp_path):
    """Two trials, two processes, neither this one nor the server: nothing of one trial
    (its memory, threads, modules it imported) is there for the next."""
    pids = []
    for name in ("a", "b"):
        out = tmp_path / name
        result = launch_plan(faulty_plan(world=1), out, "test")
        assert result.status == "ok", result.reason
        pids.append(_pid(out))
        assert_nothing_left(out)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert result.metrics["phases_s"]["setup"] >= 0


@pytest.mark.timeout(120)
def test_a_forked_rank_that_hangs_times_out_with_its_stack(tmp_path, monkeypatch):
    out = tmp_path / "hang"
    timeout = 15.0
    # The deadline passes as soon as the rank is in its hang, not 15 s of waiting later
    # (the real clock's timeout: test_launch.py's hang, on two forked ranks).
    timeout_once_hung(monkeypatch, tmp_path / "hung", timeout)
    # the rank hangs for ever: were it not stopped, the test's own timeout would fail it
    result = launch_plan(faulty_plan(world=1, hang_rank=0, timeout_s=timeout), out, "test")
    assert result.status == "timeout"
    assert result.reason.startswith(f"no result after {timeout:g} s; the trial was stopped")
    assert "ranks still running: 0" in result.reason
    assert "in loss" in (out / "logs" / "stack-rank0.txt").read_text()
    assert json.loads((out / "result.json").read_text())["status"] == "timeout"
    assert_nothing_left(out)


@pytest.mark.timeout(180)
def test_switched_off_a_rank_is_a_new_interpreter(tmp_path, monkeypatch):
    def no_fork(*args, **kwargs):
        raise AssertionError("forked although HARNESS_FORK_RANKS=0")

    monkeypatch.setattr(rank_server, "start_rank", no_fork)
    monkeypatch.setenv(rank_server.ENV, "0")
    out = tmp_path / "plain"
    result = launch_plan(faulty_plan(world=1), out, "test")
    assert result.status == "ok", result.reason
    assert_nothing_left(out)


@pytest.mark.timeout(180)
def test_the_helper_prepares_a_plan_and_says_where_its_time_went():
    """`harness bench` and the tuner prepare a plan the one way (TorchHelper.prepare): the
    prepared plan and the helper's phases; a user's mistake as a HarnessError with its
    exit code, anything else as a crash."""
    from training_harness.core.errors import HarnessError
    from training_harness.launch.torch_helper import ProbeCrashed, TorchHelper

    plan = faulty_plan(world=1)
    helper = TorchHelper()
    try:
        phases: dict[str, float] = {}
        prepared = helper.prepare(plan, phases=phases)
        assert prepared.plan.name == plan.name and prepared.flops_per_sample > 0
        assert prepared.predicted["peak_memory_bytes"] > 0 and prepared.env["torch"]
        assert set(phases) == {"check", "peaks", "flops", "estimate", "env"}
        with pytest.raises(HarnessError, match="unknown strategy 'amq'") as bad:
            helper.prepare(plan.replace(strategies={"amq": {}}))
        assert bad.value.exit_code == 2
        with pytest.raises(ProbeCrashed, match="KeyError"):
            helper._ask({"op": "no such op"})
    finally:
        helper.close()


@pytest.mark.timeout(120)
def test_the_tuners_torch_side_helper_is_a_fork_of_the_server():
    """The helper answers from a fork of the rank server (torch imported once for the
    study's trials and its questions); one that died is replaced at the next question.
    Its log's name is gone once it answered (the file stays readable, to explain a
    crash): a tuner that is killed leaves nothing in the tmp dir (a suite run left a
    handful)."""
    from multiprocessing import forkserver

    import psutil

    from training_harness.launch.torch_helper import TorchHelper

    helper = TorchHelper()
    try:
        assert "cuda" in helper.devices()
        log = os.readlink(f"/proc/self/fd/{helper._stderr.fileno()}")
        assert helper._log is None and log.endswith(" (deleted)")
        assert os.path.basename(log).startswith("harness-helper-")
        first = psutil.Process(helper._proc.pid)
        assert first.name() == rank_server.HELPER_NAME
        assert first.ppid() == forkserver._forkserver._forkserver_pid
        first.kill()
        first.wait(10)
        assert "cuda" in helper.devices()
        assert helper._proc.pid != first.pid
        assert os.readlink(f"/proc/self/fd/{helper._stderr.fileno()}").endswith(" (deleted)")
    finally:
        helper.close()


def test_a_helper_whose_status_is_not_reported_yet_is_known_dead_by_its_connection():
    """A fork's exit status comes through the server a moment after its death (under
    load, after the next question was sent to the dead helper): its closed end of the
    connection says so first."""
    from multiprocessing import Pipe

    from training_harness.launch.torch_helper import TorchHelper

    class NotReportedYet:
        def poll(self):
            return None

    helper = TorchHelper()
    ours, theirs = Pipe(duplex=True)
    helper._proc, helper._conn = NotReportedYet(), ours
    assert helper._alive()
    theirs.close()  # as the dying fork's end
    assert not helper._alive()
    ours.close()
    helper._proc = helper._conn = None
