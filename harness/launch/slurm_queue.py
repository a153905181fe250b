"""Asking Slurm about one job, and what a trial's job asks of Slurm.

    flags = job_flags(cluster, shape, minutes, "quickstart-3")   # sbatch's flags
    refusal(flags)            # None, or why sbatch --test-only would not take the job
    info = job_info("1234")   # its state, times, nodes (squeue, else sacct)
    cancel("1234")

squeue answers for a job until Slurm forgets it (MinJobAge, 5 minutes by default);
sacct after that, where the cluster keeps accounting. Both are asked once a poll
for one job: far below the load submitit's own polling puts on a controller.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from training_harness.core.cluster import ClusterSpec
from training_harness.core.errors import HarnessError

# The states a job leaves the queue in (squeue's %T, sacct's State), and those of them
# that say the machine failed it, not the trial: those are submitted once more.
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
         "OUT_OF_MEMORY", "DEADLINE", "SPECIAL_EXIT", "REVOKED", "UNKNOWN"}
RETRIED = {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"}
# Why a pending job waits, when it will wait for ever: what it asks for is beyond what
# the partition, the account or the QOS allow (sbatch takes such jobs unless the cluster
# enforces its limits at submission; sbatch --test-only refuses them).
NEVER_RUNS = {"PartitionConfig", "BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit",
              "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
              "DependencyNeverSatisfied"}
COMMAND_TIMEOUT_S = 60.0  # for one squeue/sacct/scancel call: a busy controller is slow


@dataclass(frozen=True)
class Shape:
    """A trial's job: its nodes and the ranks (one torchrun) on each."""

    nodes: int
    ranks_per_node: int
    gpus_per_node: int | None  # None: a CPU trial


def shape_for(cluster: ClusterSpec, device_type: str, world_size: int, nnodes: int = 1) -> Shape:
    """As many nodes as the layout needs: `nnodes` when the caller gives more than one,
    else the fewest with at most gpus_per_node ranks each (CUDA), else one node."""
    nodes = nnodes
    cuda = device_type == "cuda"
    if nodes == 1 and cuda and cluster.gpus_per_node:
        nodes = math.ceil(world_size / cluster.gpus_per_node)
        while world_size % nodes:  # every node the same number of ranks
            nodes += 1
    per_node = world_size // nodes
    return Shape(nodes, per_node, per_node if cuda else None)


def job_flags(cluster: ClusterSpec, shape: Shape, minutes: int, name: str) -> dict[str, Any]:
    """sbatch's long flags for one trial's job (True: a flag without a value). One task a
    node runs the node's torchrun; --no-requeue: the launcher retries a failed node itself,
    as a new job it can count."""
    flags: dict[str, Any] = {"job-name": name, "nodes": shape.nodes, "ntasks-per-node": 1,
                             "time": minutes, "no-requeue": True}
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(cluster, key) is not None:
            flags[key] = getattr(cluster, key)
    if shape.gpus_per_node:
        flags["gpus-per-node"] = shape.gpus_per_node
    if cluster.cpus_per_task:
        flags["cpus-per-task"] = cluster.cpus_per_task
    return {**flags, **cluster.sbatch_flags()}


def as_argv(flags: dict[str, Any]) -> list[str]:
    return [f"--{k}" if v is True else f"--{k}={v}" for k, v in flags.items()]


def need_slurm() -> None:
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise HarnessError("cluster.launcher = 'slurm': Slurm's sbatch and squeue are not on "
                           "PATH; run on a login node of the cluster (or inside an "
                           "allocation), or set launcher = 'local'")


# Variables of the allocation the tuner may run in: a job submitted from inside one
# inherits its environment (sbatch's default), and these would describe the tuner's
# allocation instead of the trial's (srun reads SLURM_CPUS_PER_TASK, SLURM_MEM_PER_NODE,
# ...; the tuner's share of its GPUs). SLURM_CONF names the cluster: it stays.
_ALLOCATION_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SUBMITIT_")
_ALLOCATION_NAMES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def _from_allocation(name: str) -> bool:
    return name != "SLURM_CONF" and (name.startswith(_ALLOCATION_PREFIXES)
                                     or name in _ALLOCATION_NAMES)


@contextlib.contextmanager
def outside_allocation() -> Iterator[None]:
    """os.environ without the tuner's allocation, meanwhile (submitit's sbatch reads it)."""
    kept = {k: os.environ.pop(k) for k in list(os.environ) if _from_allocation(k)}
    try:
        yield
    finally:
        os.environ.update(kept)


def refusal(flags: dict[str, Any]) -> str | None:
    """Why Slurm would not take a job with these flags (sbatch --test-only: nothing is
    queued), in sbatch's words; None when it would."""
    need_slurm()
    argv = ["sbatch", "--test-only", *as_argv(flags), "--wrap", "true"]
    env = {k: v for k, v in os.environ.items() if not _from_allocation(k)}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              env=env)
    except subprocess.TimeoutExpired:
        return f"sbatch --test-only did not answer in {COMMAND_TIMEOUT_S:g}s"
    if done.returncode == 0:
        return None
    return error_text(done.stderr or done.stdout) or f"sbatch exited with {done.returncode}"


def error_text(text: str) -> str:
    """sbatch's errors on one line, without its `sbatch: error:` prefixes."""
    lines = [re.sub(r"^(sbatch|srun|salloc): error: ", "", ln.strip())
             for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith("sbatch: ")] or lines
    return "; ".join(dict.fromkeys(errors))


@dataclass
class JobInfo:
    state: str  # PENDING, RUNNING, COMPLETING, then one of ENDED
    submitted: float | None = None  # epoch seconds
    started: float | None = None
    ended: float | None = None
    nodes: str = ""  # Slurm's node list, e.g. "gpu[01-04]"
    partition: str = ""
    reason: str = ""  # why it waits, or why it ended

    @property
    def over(self) -> bool:
        return self.state in ENDED

    @property
    def queue_wait_s(self) -> float | None:
        if self.submitted is None or self.started is None:
            return None
        return max(0.0, self.started - self.submitted)


def job_info(job_id: str) -> JobInfo:
    """The job's state now: squeue while Slurm remembers it, then sacct, else UNKNOWN.
    A controller that does not answer is UNREACHABLE, which is not an end: ask again."""
    ok, out, err = _ask(["squeue", "-h", "-t", "all", "-j", job_id, "-o",
                         "%T|%V|%S|%e|%N|%P|%r"])
    if ok and out:
        return _info(out[0])
    if not ok and "invalid job id" not in err.lower():
        return JobInfo("UNREACHABLE", reason=err.strip() or "squeue did not answer")
    ok, out, _ = _ask(["sacct", "-X", "-n", "-P", "-j", job_id, "-o",
                       "State,Submit,Start,End,NodeList,Partition,Reason"])
    if ok and out:
        return _info(out[0])
    return JobInfo("UNKNOWN", reason="neither squeue nor sacct knows the job any more")


def _info(line: str) -> JobInfo:
    state, submitted, started, ended, nodes, partition, reason = (line.split("|") + [""] * 7)[:7]
    return JobInfo(state.split()[0] if state.strip() else "UNKNOWN", _epoch(submitted),
                   _epoch(started), _epoch(ended), nodes, partition,
                   "" if reason == "None" else reason)


def cancel(job_id: str) -> None:
    """scancel; the job leaves the queue when its processes are gone (see wait_gone)."""
    # Unanswered: wait_gone still waits, and a job scancel could not reach ends at its limit.
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["scancel", job_id], capture_output=True, timeout=COMMAND_TIMEOUT_S)


def wait_gone(job_id: str, patience_s: float = 300.0) -> JobInfo:
    """Wait until the job has left the queue (COMPLETING included), up to `patience_s`."""
    give_up = time.monotonic() + patience_s
    while True:
        info = job_info(job_id)
        if info.over or time.monotonic() > give_up:
            return info
        time.sleep(0.5)


def _ask(argv: list[str]) -> tuple[bool, list[str], str]:
    """(answered, its lines, its error text)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, [], str(e)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    return done.returncode == 0, lines, done.stderr


def _epoch(text: str) -> float | None:
    """Slurm's times are the controller's local time, e.g. 2026-11-23T11:36:37."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None  # N/A, Unknown, None
