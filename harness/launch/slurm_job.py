"""What runs inside a trial's Slurm job: one task a node, each the local launcher.

submitit runs `run_node` once a node (srun, one task a node). Each calls
training_harness.launch.local.launch for its node: one process for a one-rank trial, else
torchrun with the node's ranks. On several nodes they meet at node 0 through torchrun's
static rendezvous, as torchrun users do on Slurm: the node rank is the task's
SLURM_NODEID, so ranks 0..k-1 run on the job's first node, k..2k-1 on its second,
whatever order the nodes start in; the master address is node 0's, with a port free
there, which node 0 writes into the trial's folder (on storage every node sees).
Node 0 writes result.json, as on one machine; the tuner's side (training_harness.launch.slurm)
reads it when the job has ended.

Runs on the compute node, where it is the job's main process: a SIGTERM (scancel,
the time limit, a preemption) ends the local launcher's wait, which then stops the
trial's processes before the job ends.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

RDZV_FILE = "rdzv-endpoint.txt"  # in the job's folder: node 0's host:port
RDZV_WAIT_S = 300.0  # for node 0 to write it (nodes start within seconds of each other)


def run_node(prepared_file: str, out_dir: str, command: str, study: str | None,
             trial_id: int | str | None, nnodes: int, timeout_s: float,
             progress_file: str | None, job_dir: str, ends_at: float | None = None) -> str:
    """Run this node's part of the trial; returns its record's status (node 0's says
    the trial's, the others' whether their ranks finished). `ends_at` (epoch seconds):
    the study's deadline, which the trial must not outlast whenever the job started."""
    import submitit

    from training_harness.core.prepared import PreparedPlan
    from training_harness.launch import local, rank_server, slurm_nodes

    signal.signal(signal.SIGTERM, _exit)  # submitit ignores SIGTERM; the trial must stop
    os.environ[rank_server.ENV] = "0"  # a fresh interpreter: nothing here to fork from
    env = submitit.JobEnvironment()
    node = env.node  # SLURM_NODEID: the node's rank in the job, the torchrun node rank
    endpoint = _endpoint(Path(job_dir), node, env.job_id) if nnodes > 1 else None
    prepared = PreparedPlan.read(prepared_file)
    if ends_at is not None:  # time in the queue came out of the trial's share
        timeout_s = max(1.0, min(timeout_s, ends_at - time.time()))
    if prepared.device_type == "cuda":  # this node's GPUs, not the preparing machine's
        prepared.env = {**prepared.env, "gpus": node_gpus()}
    result = local.launch(
        prepared, out_dir, command, study=study, trial_id=trial_id,
        nnodes=nnodes, node_rank=node, rdzv_endpoint=endpoint, timeout_s=timeout_s,
        progress_file=progress_file if node == 0 else None, rdzv_backend="static",
    )
    slurm_nodes.write_node(job_dir, env.job_id, node, result.status, result.reason or "")
    print(f"node {node} of {nnodes} ({slurm_nodes.this_node_name()} on {socket.gethostname()}): "
          f"{result.status}{': ' + result.reason if result.reason else ''}", flush=True)
    return result.status


def node_gpus() -> list[dict[str, object]]:
    """The GPUs the job has on this node: those CUDA_VISIBLE_DEVICES names (Slurm sets it
    to the job's), else every GPU NVML sees. Counted without a CUDA context."""
    from training_harness.measure.nvml import gpu_names

    names = gpu_names()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [{"index": i, "name": name} for i, name in enumerate(names)]
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return [{"index": i, "id": v, "name": names[int(v)] if v.isdigit() and int(v) < len(names)
             else None} for i, v in enumerate(ids)]


def _endpoint(job_dir: Path, node: int, job_id: str) -> str:
    """Node 0 picks a free port on itself and writes host:port; the others read it."""
    path = job_dir / f"{job_id}_{RDZV_FILE}"
    if node == 0:
        from training_harness.core.ports import free_port
        from training_harness.records.run_store import write_atomic

        host = socket.gethostname()
        write_atomic(path, f"{host}:{free_port('0.0.0.0')}\n")
    give_up = time.monotonic() + RDZV_WAIT_S
    while not path.exists():
        if time.monotonic() > give_up:
            raise RuntimeError(f"node 0 wrote no rendezvous address into {path} in "
                               f"{RDZV_WAIT_S:g}s: is the folder on storage every node sees?")
        time.sleep(0.2)
    return path.read_text().strip()


def _exit(signum: int, frame: object) -> None:
    print(f"caught signal {signum}: stopping the trial", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)
