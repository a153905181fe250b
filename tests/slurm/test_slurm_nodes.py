"""training_harness.launch.slurm_nodes without a cluster: node names by index, each rank's node,
and the word of a node whose part of a job never ended (Slurm's commands stood in)."""

from __future__ import annotations

from tests.slurm.conftest import stand_in
from training_harness.launch import slurm_nodes
from training_harness.launch.slurm_queue import JobInfo
from training_harness.launch.slurm_record import Attempt, at_time_limit
from training_harness.records.result import TrialResult


def record(status: str = "failed", reason: str = "rank 0 failed: Connection closed by peer",
           per_rank: list | None = None) -> TrialResult:
    return TrialResult.not_measured(status, reason, study="s", trial_id=1,
                                    plan={"layout": {"data": 2}}, predicted=None, env={},
                                    command="test", started_at=None, duration_s=1.0,
                                    metrics={"per_rank": per_rank} if per_rank else {})


def test_node_names_come_from_the_nodes_then_from_slurms_list(fake_bin):
    stand_in(fake_bin, "scontrol", 'echo n1; echo n2')  # scontrol show hostnames n[1-2]
    assert slurm_nodes.node_names([{"node": 0, "name": "a"}, {"node": 1, "name": "b"}],
                                  "") == ["a", "b"]
    assert slurm_nodes.node_names([{"node": 0, "name": "n1"}], "n[1-2]") == ["n1", "n2"]


def test_each_ranks_node_is_the_one_it_was_launched_on(tmp_path):
    r = record("ok", "", per_rank=[{"rank": 1, "launched_node": 0},
                                   {"rank": 0, "launched_node": 1}])
    assert slurm_nodes.rank_nodes(r, tmp_path, ["n1", "n2"]) == ["n2", "n1"]


def test_a_node_that_said_nothing_is_named_with_slurms_word(fake_bin, tmp_path, monkeypatch):
    stand_in(fake_bin, "sinfo", 'echo "n2|down*|Not responding"')
    r = record()
    slurm_nodes.across_nodes(r, tmp_path, ["n1", "n2"], [{"node": 0, "name": "n1"}])
    assert r.reason.startswith("node n2 stopped during the trial")
    assert "Slurm now says n2: down* (Not responding). What the other nodes saw: rank 0 " \
           "failed: Connection closed by peer" in r.reason
    assert r.metrics["lost_nodes"] == {"n2": "down* (Not responding)"}

    # Slurm has not noticed (yet): after a short wait, what it says is recorded as is.
    stand_in(fake_bin, "sinfo", 'echo "n2|allocated|none"')
    monkeypatch.setattr(slurm_nodes, "LOST_NODE_WAIT_S", 0.0)
    r = record()
    slurm_nodes.across_nodes(r, tmp_path, ["n1", "n2"], [{"node": 0, "name": "n1"}])
    assert "Slurm now says n2: allocated." in r.reason

    r = record()  # every node ended its part: nothing to add
    slurm_nodes.across_nodes(r, tmp_path, ["n1", "n2"], [{"node": 0}, {"node": 1}])
    assert r.reason == "rank 0 failed: Connection closed by peer" and "lost_nodes" not in r.metrics


def test_a_job_at_slurms_time_limit_is_a_timeout_not_a_lost_node(fake_bin, tmp_path):
    # Node 0 wrote "failed" as Slurm's SIGTERM at the time limit ended its ranks; n2 had
    # no time to say a word. Neither the ranks nor the node are to blame: the limit is.
    stand_in(fake_bin, "sinfo", 'echo "n2|idle|none"')
    r = record(reason="rank 1 failed: SIGTERM")
    at_time_limit(r, Attempt("7", JobInfo("TIMEOUT", nodes="n[1-2]")), 3)
    slurm_nodes.across_nodes(r, tmp_path, ["n1", "n2"], [{"node": 0, "name": "n1"}])
    assert r.status == "timeout" and "lost_nodes" not in r.metrics
    assert r.reason == ("Slurm stopped job 7 at its time limit (3 min) before the trial had "
                        "ended; what the ranks said: rank 1 failed: SIGTERM")
    for state in ("COMPLETED", "FAILED"):  # any other end: the record stands as written
        r = record()
        at_time_limit(r, Attempt("7", JobInfo(state)), 3)
        assert (r.status, r.reason) == ("failed", "rank 0 failed: Connection closed by peer")
