"""The [cluster] table of a study or a plan: where its trials run.

    [cluster]
    launcher = "slurm"          # "local" (default): process groups on this machine
    partition = "gpu"           # and account, qos, constraint, reservation (optional)
    gpus_per_node = 8
    cpus_per_task = 16
    time = "30m"                # each trial job's limit (default: its timeout + 2m)
    max_jobs = 4                # trials in flight at once (see below)
    sbatch = ["--exclusive"]    # anything else, passed to sbatch as written

Each trial is one Slurm job (training_harness.launch.slurm); the tuner keeps up to `max_jobs`
of them in flight at once (training_harness.launch.jobs_in_flight).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.core.units import parse_duration

# Between a trial's timeout and its job's time limit: the job starts Python, unpickles
# the call and starts torchrun, and a stopped trial has its grace period.
JOB_MARGIN_S = 120.0

# Flags the launcher sets from the keys above or itself: given in `sbatch`, they would
# contradict it. Flag -> the key to use instead.
_OWN_FLAGS = {
    "partition": "partition", "p": "partition", "account": "account", "A": "account",
    "qos": "qos", "q": "qos", "constraint": "constraint", "C": "constraint",
    "reservation": "reservation", "gpus-per-node": "gpus_per_node",
    "cpus-per-task": "cpus_per_task", "c": "cpus_per_task", "time": "time", "t": "time",
    "nodes": None, "N": None, "ntasks-per-node": None, "ntasks": None, "n": None,
    "output": None, "o": None, "error": None, "e": None, "job-name": None, "J": None,
    "array": None, "wrap": None,
}


@dataclass
class ClusterSpec:
    """Where trials run: this machine, or one Slurm job each (docs/slurm.md)."""

    launcher: Literal["local", "slurm"] = "local"
    """local: process groups on this machine; slurm: each trial one Slurm job."""
    partition: str | None = None
    """The Slurm partition (unset: the cluster's default)."""
    account: str | None = None
    """The Slurm account to charge (unset: yours by default)."""
    qos: str | None = None
    """The Slurm quality of service (unset: the default)."""
    constraint: str | None = None
    """Slurm's --constraint on node features."""
    reservation: str | None = None
    """A Slurm reservation to run in."""
    gpus_per_node: int | None = bounded(None, 1, 1024)
    """Ranks per node of a CUDA trial: 16 ranks on nodes of 8 get 2 nodes."""
    cpus_per_task: int | None = bounded(None, 1, 4096)
    """CPUs of the one task per node that runs torchrun and its ranks."""
    time: str | float | None = None
    """Each job's limit, in whole minutes (unset: the trial's timeout + 2m)."""
    max_jobs: int = bounded(1, 1, 10_000)
    """Trials in flight at once."""
    sbatch: list[str] = field(default_factory=list)
    """Anything else, passed to sbatch as written, one flag an item: ["--exclusive"]."""

    def validate(self, where: str) -> None:
        for key in ("partition", "account", "qos", "constraint", "reservation"):
            value = getattr(self, key)
            if value is not None and (not value.strip() or re.search(r"\s", value)):
                raise HarnessError(f"{where}.{key}: {value!r} must be a Slurm name "
                                   "without spaces; leave the key out for the default")
        if self.time is not None:
            parse_duration(self.time, f"{where}.time")
        self.sbatch_flags(where)

    def sbatch_flags(self, where: str = "cluster") -> dict[str, Any]:
        """`sbatch` as submitit's additional parameters: "--exclusive" -> {"exclusive": True},
        "--mem=0" -> {"mem": "0"}."""
        flags: dict[str, Any] = {}
        for i, item in enumerate(self.sbatch):
            m = re.fullmatch(r"--?([A-Za-z][\w-]*)(?:=(.+))?", item.strip())
            if not m:
                raise HarnessError(f"{where}.sbatch[{i}]: {item!r}: write sbatch's long form, "
                                   "one flag an item, e.g. \"--exclusive\" or \"--mem=0\"")
            name = m.group(1)
            if name in _OWN_FLAGS:
                key = _OWN_FLAGS[name]
                instead = f"set {where}.{key}" if key else "the launcher sets it for each trial"
                raise HarnessError(f"{where}.sbatch[{i}]: {item!r}: {instead}, not in sbatch")
            flags[name] = m.group(2) if m.group(2) is not None else True
        return flags

    def job_minutes(self, trial_timeout_s: float) -> int:
        """The job's time limit in minutes: `time`, or the trial's timeout and the margin."""
        if self.time is None:
            return math.ceil((trial_timeout_s + JOB_MARGIN_S) / 60)
        return max(1, math.ceil(parse_duration(self.time, "cluster.time") / 60))

    def check_timeout(self, trial_timeout_s: float, key: str, where: str) -> None:
        """Refuse a trial timeout that does not fit in `time` with the margin."""
        if self.launcher != "slurm" or self.time is None:
            return
        limit = parse_duration(self.time, f"{where}.time")
        if trial_timeout_s + JOB_MARGIN_S > limit:
            raise HarnessError(
                f"{where}.time {self.time!r}: a trial job must outlast the trial's {key} "
                f"({trial_timeout_s:g}s) by {JOB_MARGIN_S:g}s (start-up and stopping); "
                f"raise time to at least {math.ceil((trial_timeout_s + JOB_MARGIN_S) / 60)}m, "
                f"lower {key}, or leave time out to derive it")
