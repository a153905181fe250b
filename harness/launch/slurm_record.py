"""What a trial's Slurm jobs leave for its record: each job tried (`Attempt`), the status
and reason in words of one that left no record, tags["cluster"], and the jobs'
stdout/stderr in the trial's logs/."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_harness.launch.slurm_queue import JobInfo
from training_harness.records.result import TrialResult


@dataclass
class Attempt:
    """One job submitted for a trial (training_harness.launch.slurm), as it went."""

    job_id: str | None  # None: sbatch refused it
    info: JobInfo | None = None  # as it left the queue
    stopped: str | None = None  # why we cancelled it: timeout, deadline, pruned, never or
    # unreachable (the controller stopped answering)
    why: str | None = None  # should_stop's reason, or sbatch's refusal
    ran_s: float = 0.0  # from its start (as seen here) to its end

    def as_tag(self) -> dict[str, Any]:
        info = self.info or JobInfo("SUBMITTED" if self.job_id else "NOT_SUBMITTED")
        return {"job_id": self.job_id, "state": info.state, "nodes": info.nodes,
                "queue_wait_s": info.queue_wait_s, "stopped": self.stopped}


def reason_for(attempt: Attempt, timeout: float, startup_s: float,
               stderr_tail: str | None) -> tuple[str, str]:
    """(status, reason) of a job that ended without node 0's record; `stderr_tail` is
    None when the job wrote no output file at all."""
    job, info = attempt.job_id, attempt.info
    if job is None:
        return "failed", f"sbatch refused the trial's job: {attempt.why}"
    state = info.state if info else "UNKNOWN"
    where = f"job {job}" + (f" on {info.nodes}" if info and info.nodes else "")
    if attempt.stopped == "never":
        return "failed", (f"{where} could never start (Slurm: {attempt.why}: it asks for more "
                          "than the partition, account or QOS allow) and was cancelled; "
                          "check the [cluster] table against `sinfo` and `scontrol show "
                          "partition`")
    if attempt.stopped == "unreachable":
        return "failed", (f"{where} was given up: the Slurm controller stopped answering "
                          f"(squeue: {attempt.why or 'no answer'}); scancel was tried; "
                          "check `scontrol ping`")
    if attempt.stopped == "pruned":
        return "pruned", attempt.why or "stopped early"
    if attempt.stopped == "timeout":
        return "timeout", (f"{where} ran past the trial's timeout ({timeout:g}s, and "
                           f"{startup_s:g}s to start and stop it) and was cancelled (scancel)")
    if attempt.stopped == "deadline":
        still = "still queued" if attempt.ran_s == 0 else "running"
        return "timeout", f"{where} was cancelled at the study's deadline, {still}"
    if state == "TIMEOUT":
        return "timeout", f"Slurm stopped {where} at its time limit"
    if state == "OUT_OF_MEMORY":
        return "oom", f"Slurm stopped {where}: out of the node's memory"
    said = f" ({info.reason})" if info and info.reason else ""
    tail = f"; the job's stderr ends: {stderr_tail[-600:]}" if stderr_tail else ""
    if stderr_tail is None and attempt.ran_s > 0:  # it ran, yet nothing came back here
        tail = ("; it wrote no output where this machine can see it: is the trial's "
                "folder on a file system the compute nodes share (not /tmp)?")
    if state == "CANCELLED":
        return "failed", f"{where} was cancelled outside the harness (scancel){said}{tail}"
    return "failed", f"{where} ended {state}{said} and left no record{tail}"


def at_time_limit(record: TrialResult, attempt: Attempt, minutes: Any) -> None:
    """Node 0 wrote a failed record because Slurm's time limit stopped the job (its
    SIGTERM ended the ranks): say so, rather than blame the ranks or a node that had
    no time to say a word (training_harness.launch.slurm_nodes.across_nodes)."""
    if record.status != "failed" or attempt.info is None or attempt.info.state != "TIMEOUT":
        return
    record.status = "timeout"
    record.reason = (f"Slurm stopped job {attempt.job_id} at its time limit ({minutes} min) "
                     f"before the trial had ended; what the ranks said: {record.reason}")


def cluster_tag(partition: str | None, attempts: list[Attempt], node_names: list[str],
                rank_nodes: list[str | None]) -> dict[str, Any]:
    """tags["cluster"]: `nodes` is Slurm's node list ("n[1-2]"), `node_names` each node by
    index, `rank_nodes` the node of each rank (training_harness.launch.slurm_nodes)."""
    last = attempts[-1]
    info = last.info or JobInfo("NOT_SUBMITTED")
    return {"launcher": "slurm", "job_id": last.job_id, "nodes": info.nodes,
            "node_names": node_names, "rank_nodes": rank_nodes,
            "partition": info.partition or partition, "queue_wait_s": info.queue_wait_s,
            "state": info.state, "jobs": [a.as_tag() for a in attempts]}


def job_logs(out: Path, job_id: str | None) -> list[Path]:
    return sorted((out / "slurm").glob(f"{job_id}_*_log.*")) if job_id else []


def stderr_tail(out: Path, job_id: str | None, size: int = 1500) -> str | None:
    """The end of node 0's stderr; None when the job left no output file at all."""
    if not job_logs(out, job_id):
        return None
    errs = [p for p in job_logs(out, job_id) if p.suffix == ".err"]
    if not errs:
        return ""
    with errs[0].open("rb") as f:
        f.seek(max(0, errs[0].stat().st_size - size))
        return f.read().decode(errors="replace").strip()


def copy_logs(out: Path, attempts: list[Attempt]) -> None:
    """Each job's stdout/stderr (one pair a node) into logs/, as slurm-<job>-<task>.*."""
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    for attempt in attempts:
        for path in job_logs(out, attempt.job_id):
            task = path.name.split("_")[1]
            ext = "out" if path.suffix == ".out" else "err"
            with contextlib.suppress(OSError):
                shutil.copyfile(path, logs / f"slurm-{attempt.job_id}-{task}.{ext}")
