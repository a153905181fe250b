"""How a Slurm job's nodes place their ranks (training_harness.launch.slurm_job runs the local
launcher once a node with rdzv_backend="static"): node K runs ranks K*k..(K+1)*k-1,
whichever node starts first, as torchrun's --node-rank gives them. No Slurm needed:
the two nodes' launchers run here, on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from tests.distributed.launch_helpers import (
    assert_nothing_left,
    faulty_plan,
    in_repo_root,  # noqa: F401  (a fixture)
)
from training_harness.core.errors import HarnessError
from training_harness.core.ports import free_port
from training_harness.launch import local
from training_harness.measure.prepare import prepare


def test_static_torchrun_takes_the_node_rank_and_node_0s_address(tmp_path):
    plan = faulty_plan(world=4)
    argv = local._torchrun(plan, 2, "n1:29511", tmp_path, "run", "static", 1)
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--rdzv-backend"] == "static" and flags["--node-rank"] == "1"
    assert flags["--master-addr"] == "n1" and flags["--master-port"] == "29511"
    assert flags["--nproc-per-node"] == "2" and "--rdzv-endpoint" not in flags
    # Outside a Slurm job (harness bench --nnodes): c10d, the nodes in arrival order.
    argv = local._torchrun(plan, 2, "n1:29511", tmp_path, "run")
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--rdzv-backend"] == "c10d" and flags["--rdzv-endpoint"] == "n1:29511"
    assert "--node-rank" not in flags


def test_an_unknown_rendezvous_backend_is_refused_before_anything_starts(tmp_path):
    prepared = prepare(faulty_plan()).checked()
    with pytest.raises(HarnessError, match="rdzv_backend 'etcd': one of c10d, static"):
        local.launch(prepared, tmp_path / "x", "test", nnodes=2, rdzv_endpoint="h:1",
                     rdzv_backend="etcd")
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # two torchrun agents and their ranks: 10-60 s on 2 shared cores
@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("in_repo_root")
def test_node_1_started_first_still_runs_ranks_2_and_3(tmp_path):
    # Two ranks a node. With c10d the node that arrives first would most likely take
    # ranks 0 and 1.
    prepared = prepare(faulty_plan(world=4, steps=1, timeout_s=150.0)).checked()  # a ceiling
    out, endpoint = tmp_path / "trial", f"127.0.0.1:{free_port()}"
    results: dict[int, object] = {}

    def node(rank: int) -> None:
        results[rank] = local.launch(prepared, out, "test", nnodes=2, node_rank=rank,
                                     rdzv_endpoint=endpoint, rdzv_backend="static")

    second = threading.Thread(target=node, args=(1,))
    second.start()
    time.sleep(1.0)  # node 1 waits at node 0's address until node 0 listens
    node(0)
    second.join(timeout=200)
    record = results[0]
    assert record.status == "ok", record.reason
    placed = [(r["rank"], r["launched_node"]) for r in record.metrics["per_rank"]]
    assert placed == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert results[1].reason.startswith("node 1 of 2: its ranks finished")
    assert_nothing_left(out)
