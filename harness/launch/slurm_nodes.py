"""What each node of a trial's Slurm job left: its name, its ranks, and where a trial
that failed or hung across nodes went wrong.

    write_node(job_dir, job_id, node, "ok", "")          # in the job, by run_node
    nodes = read_nodes(out, job_id)                       # here, once the job has ended
    names = node_names(nodes, "n[1-2]")                   # ["n1", "n2"]
    rank_nodes(record, out, names)                        # ["n1", "n2"]: rank 0's, rank 1's
    across_nodes(record, out, names)                      # the failing rank's node, stacks

Every node's launcher keeps its ranks' logs in the trial's logs/node<K>/ (training_harness.launch.
local), on the folder all nodes share, so the root cause of a failure is looked for
over all nodes here: node 0's own launcher sees only its ranks, whose error is often
the symptom ("Connection closed by peer") of a rank that failed on another node. A
node's name is Slurm's (SLURMD_NODENAME: several slurmd daemons on one machine share a
hostname), else its short hostname.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from training_harness.launch.rank_logs import RankLog, read_rank_logs, root_cause
from training_harness.launch.verdict import with_tail
from training_harness.records.result import TrialResult
from training_harness.records.run_store import write_atomic

STACK_CHARS = 3000  # of each stopped rank's stack, in the record
LOST_NODE_WAIT_S = 30.0  # for Slurm's word on a node whose part of the job never ended


def node_file(job_dir: Path, job_id: str, node: int) -> Path:
    return job_dir / f"{job_id}_{node}_node.json"


def this_node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def write_node(job_dir: str | Path, job_id: str, node: int, status: str, reason: str) -> None:
    """This node's name and how its part ended, for the caller (whole or not at all)."""
    path = node_file(Path(job_dir), job_id, node)
    write_atomic(path, json.dumps({"node": node, "name": this_node_name(),
                                   "host": socket.gethostname(), "status": status,
                                   "reason": reason}))


def read_nodes(out: Path, job_id: str | None) -> list[dict[str, Any]]:
    """The node files the job's nodes wrote, by node index (none when it never ran)."""
    if job_id is None:
        return []
    found = []
    for path in (out / "slurm").glob(f"{job_id}_*_node.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return sorted(found, key=lambda n: n["node"])


def node_names(nodes: list[dict[str, Any]], nodelist: str) -> list[str]:
    """Each node's name by index: from the nodes' own files, else Slurm's node list
    expanded (scontrol show hostnames), which lists them in the same order."""
    expanded = _hostnames(nodelist) if nodelist else []
    names = {n["node"]: n["name"] for n in nodes}
    count = max(len(expanded), max(names, default=-1) + 1)
    return [names.get(i) or (expanded[i] if i < len(expanded) else f"node{i}")
            for i in range(count)]


def _hostnames(nodelist: str) -> list[str]:
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.split() if done.returncode == 0 else []


def _node_logs(out: Path, count: int) -> list[tuple[int, list[RankLog]]]:
    """Each node's rank logs (one node: logs/ itself)."""
    if count <= 1:
        return [(0, read_rank_logs(out / "logs"))]
    return [(k, read_rank_logs(out / "logs" / f"node{k}")) for k in range(count)]


def rank_nodes(record: TrialResult, out: Path, names: list[str]) -> list[str | None]:
    """The node of each rank: as the ranks said (metrics.per_rank's launched node), else
    from the node folder their logs are in."""
    world = record.plan.get("layout", {})
    size = world.get("data", 1) * world.get("pipeline", 1) * world.get("tensor", 1)
    found: list[str | None] = [None] * size
    for r in record.metrics.get("per_rank") or []:
        if 0 <= r.get("rank", -1) < size and 0 <= r.get("launched_node", -1) < len(names):
            found[r["rank"]] = names[r["launched_node"]]
    for k, logs in _node_logs(out, len(names)):
        for log in logs:
            if log.rank is not None and 0 <= log.rank < size and found[log.rank] is None:
                found[log.rank] = names[k] if k < len(names) else None
    return found


def across_nodes(record: TrialResult, out: Path, names: list[str],
                 nodes: list[dict[str, Any]]) -> None:
    """A failed or timed-out record of a job of several nodes, told from every node's
    logs: a failure by the rank that failed first on any node (its error, node and log
    tail), or else by the nodes whose part never ended (no node file: its processes
    were killed, or the node died) with what Slurm says of them; a hang by where every
    rank on every node was stopped (their stacks)."""
    if len(names) < 2 or record.status not in ("failed", "timeout"):
        return
    logs = [(names[k], log) for k, node in _node_logs(out, len(names)) for log in node]
    if record.status == "failed":
        cause = root_cause([log for _, log in logs])
        if cause is None or cause.is_symptom:
            _lost_nodes(record, names, nodes)
            return
        node = next(name for name, log in logs if log is cause)
        record.reason = with_tail(f"{cause.name} on node {node} failed: {cause.error}", cause,
                                  record.metrics)
        if cause.traceback:  # also where its stderr is empty
            record.metrics["traceback_tail"] = cause.traceback[-4000:]
        record.metrics["failed_rank"] = {"rank": cause.rank, "node": node,
                                         "logs": str(cause.folder)}
        return
    stacks = {str(log.rank): {"node": name, "where": log.where(),
                              "stack": log.stacks[-STACK_CHARS:]}
              for name, log in logs if log.rank is not None and log.stacks.strip()}
    if not stacks:
        return
    record.metrics["stacks"] = stacks
    where = [f"rank {rank} on {s['node']} {s['where']}" for rank, s in sorted(stacks.items())
             if s["where"]]
    if where:
        record.reason = f"{record.reason}; where each rank was stopped: {'; '.join(where)}"


def _lost_nodes(record: TrialResult, names: list[str], nodes: list[dict[str, Any]]) -> None:
    """Name the nodes whose part of the job never ended, and Slurm's word on each."""
    lost = [name for i, name in enumerate(names) if i not in {n["node"] for n in nodes}]
    if not lost or not nodes:  # none lost, or none said a word (the job never ran)
        return
    # The job may end before Slurm has noticed a dead node (SlurmdTimeout): its verdict
    # is waited for a little, then whatever it says is recorded.
    give_up = time.monotonic() + LOST_NODE_WAIT_S
    states = slurm_states(lost)
    while time.monotonic() < give_up and not all(
            _is_down(states.get(name, "")) for name in lost):
        time.sleep(1.0)
        states = slurm_states(lost)
    said = "; ".join(f"{name}: {states.get(name) or 'Slurm says nothing of it'}"
                     for name in lost)
    record.metrics["lost_nodes"] = {name: states.get(name) for name in lost}
    record.reason = (f"node {', '.join(lost)} stopped during the trial: its part of the job "
                     f"ended without a word (its processes killed, or the node died); Slurm "
                     f"now says {said}. What the other nodes saw: {record.reason}")


def _is_down(state: str) -> bool:
    return state.split(" ")[0].rstrip("*~#!%$@^-").lower() in (
        "down", "drained", "draining", "drain", "fail", "failing")


def slurm_states(names: list[str]) -> dict[str, str]:
    """Slurm's state of each node, with the reason it was set down or drained
    ("down* (Not responding)"); {} where sinfo does not answer."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in done.stdout.splitlines():
        name, state, reason = (line.split("|", 2) + ["", ""])[:3]
        states[name] = state + (f" ({reason})" if reason and reason != "none" else "")
    return states
