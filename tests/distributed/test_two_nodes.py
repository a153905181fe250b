"""Two nodes simulated on this machine: two `harness bench` launchers, one rank each,
meeting through torchrun's c10d rendezvous on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.distributed.launch_helpers import (
    ROOT,
    assert_nothing_left,
    faulty_plan,
    in_repo_root,  # noqa: F401  (a fixture)
)
from training_harness.core.ports import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_repo_root")]


@pytest.mark.slow  # two `harness bench` processes and their torchrun agents
@pytest.mark.timeout(300)
def test_two_nodes_on_loopback_complete_a_ddp_trial(tmp_path):
    # Six processes (two launchers, two agents, two ranks) each importing torch: 9 s on a
    # quiet 2-core machine, past 60 s once in a CI run of the whole suite; faulty_plan's
    # deadline (180 s) is a ceiling, and a hang still fails.
    plan_file = tmp_path / "two-nodes.toml"
    plan_file.write_text(faulty_plan().replace(name="two-nodes").to_toml())
    endpoint = f"127.0.0.1:{free_port()}"

    def bench(node: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "training_harness", "bench", str(plan_file),
             "--out", str(tmp_path / f"node{node}"), "--nnodes", "2",
             "--node-rank", str(node), "--rdzv-endpoint", endpoint],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    # Node 1 first: c10d numbers ranks by its own order, so global rank 0 is most
    # likely on node 1 here, and the record must still be made on node 0.
    second = bench(1)
    time.sleep(1.0)
    first = bench(0)
    out0, _ = first.communicate(timeout=240)
    out1, _ = second.communicate(timeout=240)
    assert first.returncode == 0, out0
    assert second.returncode == 0, out1

    record = json.loads((tmp_path / "node0" / "result.json").read_text())
    assert record["status"] == "ok", _what_happened(record, out0, out1, tmp_path)
    per_rank = record["metrics"]["per_rank"]
    assert [r["rank"] for r in per_rank] == [0, 1]
    assert sorted(r["node"] for r in per_rank) == [0, 1]
    assert sorted(r["launched_node"] for r in per_rank) == [0, 1]
    assert "--nnodes 2 --node-rank 0" in record["command"]
    # Written once, on node 0; node 1 says that its rank finished.
    assert not (tmp_path / "node1" / "result.json").exists()
    assert "node 1 of 2: its ranks finished" in out1
    assert "status" in out0 and "ok" in out0
    for node in (0, 1):
        assert_nothing_left(tmp_path / f"node{node}")


def _what_happened(record: dict, out0: str, out1: str, tmp_path) -> str:
    """The record's reason, both launchers' output and every log the nodes kept."""
    parts = [record["reason"], f"phases_s: {record['metrics'].get('phases_s')}",
             "--- node 0 printed:", out0[-3000:], "--- node 1 printed:", out1[-3000:]]
    for log in sorted(tmp_path.glob("node*/logs/**/*")):
        if log.is_file():
            parts += [f"--- {log.relative_to(tmp_path)}:", log.read_text(errors="replace")[-3000:]]
    return "\n".join(parts)
