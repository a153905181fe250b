"""Several tuners on one study: who is who, and `--workers N` on one machine.

Every worker that asks Optuna for a trial tags it with its identity (host, pid,
start time), so a later `--resume` can tell a trial whose tuner died (marked
failed) from one another worker is still running (left alone).

`--workers N` starts N-1 helper processes beside this one, all on one storage
and one deadline. Helpers only search; this process also runs the ablation and
writes the final files. With CUDA devices each worker gets its own share of them
(CUDA_VISIBLE_DEVICES); on a CPU the workers share the cores, so their timings
interfere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from training_harness.core.errors import HarnessError

WORKER_HOST_ENV = "HARNESS_WORKER_HOST"


@dataclass(frozen=True)
class Worker:
    host: str
    pid: int
    created: float

    @classmethod
    def this(cls) -> Worker:
        return cls(host_name(), os.getpid(), psutil.Process().create_time())

    @property
    def tag(self) -> str:
        return f"{self.host}|{self.pid}|{self.created:.2f}"

    @classmethod
    def parse(cls, tag: str | None) -> Worker | None:
        try:
            host, pid, created = str(tag).rsplit("|", 2)
            return cls(host, int(pid), float(created))
        except ValueError:
            return None

    def alive(self) -> bool:
        """Whether this worker still runs; a worker on another host is taken to (an
        RDB storage's heartbeat fails its trials when it is gone)."""
        if self.host != host_name():
            return True
        try:
            proc = psutil.Process(self.pid)
            same = abs(proc.create_time() - self.created) < 0.05
            return same and proc.status() != psutil.STATUS_ZOMBIE  # killed, not yet reaped
        except psutil.Error:
            return False

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def host_name() -> str:
    """This machine's name in the storage: $HARNESS_WORKER_HOST, else the host name. Set
    it where machines share a host name (containers), so one never judges another's
    process ids as its own."""
    return os.environ.get(WORKER_HOST_ENV) or socket.gethostname()


def device_groups(n_workers: int, world_size: int, cuda_devices: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each worker: the visible devices (`cuda_devices` of
    them; 0 on a CPU) split evenly."""
    if not cuda_devices:
        return [None] * n_workers
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(cuda_devices)]
    per = len(ids) // n_workers
    if per < world_size:
        raise HarnessError(
            f"--workers {n_workers}: {len(ids)} CUDA device(s) give each worker {per}, but "
            f"a trial needs up to {world_size}; use fewer workers or smaller world sizes")
    return [",".join(ids[i * per:(i + 1) * per]) for i in range(n_workers)]


def spawn_helpers(argv: list[str], groups: list[str | None], logs: Path,
                  extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start helper i (1..N-1) as `python -m training_harness tune ARGV`, logging to logs/."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, group in enumerate(groups[1:], start=1):
        env = {**os.environ, **(extra_env or {})}
        if group is not None:
            env["CUDA_VISIBLE_DEVICES"] = group
        log = open(logs / f"helper-{i}.log", "ab")  # noqa: SIM115 (closed when it ends)
        procs.append(subprocess.Popen([sys.executable, "-m", "training_harness", "tune", *argv],
                                      stdout=log, stderr=subprocess.STDOUT, env=env,
                                      stdin=subprocess.DEVNULL))
        log.close()
    return procs


def wait_for(procs: list[subprocess.Popen], timeout_s: float) -> list[int | None]:
    """Wait for the helpers (at most `timeout_s`); stop those still running."""
    import time

    end = time.monotonic() + max(timeout_s, 0)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(end - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                codes.append(p.wait(timeout=10))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
    return codes
