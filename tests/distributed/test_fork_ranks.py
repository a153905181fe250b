"""Every rank of a one-node trial forked from the rank server (training_harness.launch.rank_server):
the record torchrun gives, the first failing rank named and the others stopped at once,
a hang stopped at its timeout with its ranks named; no process left behind.

Each trial gets a free port of its own for its ranks' store (MASTER_PORT), picked by the
launcher; the `ports` fixture records which, so a test can check its ranks used it.
"""

from __future__ import annotations

import json
import math

import psutil
import pytest

from tests.distributed.launch_helpers import (  # noqa: F401  (fixture)
    assert_nothing_left,
    faulty_plan,
    in_repo_root,
    launch_plan,
)
from training_harness.launch import local, rank_server

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_repo_root"),
              pytest.mark.skipif(not rank_server.enabled(), reason="no forkserver here")]


@pytest.fixture
def ports(monkeypatch):
    """The free ports the launcher picks in this test, and the MASTER_PORT each forked
    rank was given."""
    picked, given = [], {}
    free_port, rank_env = local.free_port, rank_server.rank_env

    def pick(*args):
        picked.append(free_port(*args))
        return picked[-1]

    def env(base, rank, *args):
        out = rank_env(base, rank, *args)
        given[rank] = out.get("MASTER_PORT")
        return out

    monkeypatch.setattr(local, "free_port", pick)
    monkeypatch.setattr(rank_server, "rank_env", env)
    return picked, given


def _pids(out) -> dict[int, int]:
    """Each rank's pid, from the first line of its stderr."""
    pids = {}
    for rank in (0, 1):
        header = (out / "logs" / f"rank{rank}" / "stderr.log").read_text().splitlines()[0]
        assert header.startswith(f"harness worker: rank {rank} of 2"), header
        pids[rank] = int(header.rsplit("pid ", 1)[1])
    return pids


def _gone(pids: dict[int, int]) -> None:
    for rank, pid in pids.items():
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"rank {rank} (pid {pid}) still {status}"


@pytest.mark.slow  # two 2-rank trials, the second under torchrun (new interpreters)
@pytest.mark.timeout(180)
def test_two_forked_ranks_give_the_record_torchrun_gives(tmp_path, monkeypatch, ports):
    forked = launch_plan(faulty_plan(), tmp_path / "forked", "test")
    assert forked.status == "ok", forked.reason
    assert not (tmp_path / "forked" / "logs" / "agent.log").exists()  # no torchrun
    pids = _pids(tmp_path / "forked")
    assert ports[1] == {0: str(ports[0][0]), 1: str(ports[0][0])}
    assert_nothing_left(tmp_path / "forked")
    _gone(pids)

    monkeypatch.setenv(rank_server.ENV, "0")
    through = launch_plan(faulty_plan(), tmp_path / "torchrun", "test")
    assert through.status == "ok", through.reason
    assert (tmp_path / "torchrun" / "logs" / "agent.log").exists()
    assert_nothing_left(tmp_path / "torchrun")

    a, b = forked.metrics, through.metrics
    assert len(a["per_rank"]) == len(b["per_rank"]) == 2
    assert [r["rank"] for r in a["per_rank"]] == [0, 1]
    assert len(a["loss"]["values"]) == len(b["loss"]["values"]) == 4
    assert all(math.isclose(x, y, rel_tol=0, abs_tol=1e-6)
               for x, y in zip(a["loss"]["values"], b["loss"]["values"], strict=True))
    assert a["step_time_s"]["n"] == b["step_time_s"]["n"] == 3


@pytest.mark.timeout(120)
def test_a_rank_that_raises_fails_the_trial_and_the_other_is_stopped(tmp_path, ports):
    """Rank 0 would sleep for ever; rank 1 raises at its first step: the launcher stops
    rank 0 at once (a long timeout that was not reached), as torchrun's agent would."""
    out = tmp_path / "raises"
    result = launch_plan(faulty_plan(fail_rank=1, hang_rank=0, timeout_s=90.0), out, "test")
    assert result.status == "failed", result.reason
    first = result.reason.splitlines()[0]
    assert first == "rank 1 failed: RuntimeError: injected failure on rank 1 at step 0"
    assert "faulty_workload.py" in result.metrics["stderr_tail"]
    assert set(result.metrics["logs"]) == {"0", "1"}
    assert json.loads((out / "result.json").read_text())["status"] == "failed"
    assert ports[1][0] == str(ports[0][-1])
    pids = _pids(out)
    assert_nothing_left(out)
    _gone(pids)


@pytest.mark.timeout(120)
def test_a_rank_that_dies_without_an_error_is_named(tmp_path, ports):
    out = tmp_path / "dies"
    result = launch_plan(faulty_plan(exit_rank=1, hang_rank=0, timeout_s=90.0), out, "test")
    assert result.status == "failed", result.reason
    assert result.reason.startswith("rank 1 ended (exit code 3) without raising an error")
    pids = _pids(out)
    assert_nothing_left(out)
    _gone(pids)


# The real clock: it waits out its 20 s timeout (test_rank_server.py: a jumped clock).
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hanging_forked_trial_is_stopped_at_its_timeout(hung_two_ranks):
    # The trial (tests/distributed/conftest.py) is test_launch.py's: forked, here.
    result, out = hung_two_ranks.result, hung_two_ranks.out
    assert result.status == "timeout", result.reason
    assert result.reason.startswith(
        f"no result after {hung_two_ranks.timeout:g} s; the trial was stopped")
    assert "ranks still running: 0, 1" in result.reason
    assert "rank 1 in loss at faulty_workload.py" in result.reason
    assert "in loss" in (out / "logs" / "stack-rank1.txt").read_text()
    assert result.metrics["ranks_running"] == [0, 1]
    assert json.loads((out / "result.json").read_text())["status"] == "timeout"
    pids = _pids(out)
    assert_nothing_left(out)
    _gone(pids)
