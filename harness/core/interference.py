"""Was the machine busy while a trial measured? Other processes' share of the CPUs and GPUs.

A measurement taken while another process competes for the same cores or device
says little about the configuration: on the 2-core CPU machine one CPU-bound
process beside a study made bf16 trials 20x slower (issue 13). So each rank takes
a snapshot at both ends of its measured window:

    machine   CPU seconds the CPUs this process may run on were busy (psutil's
              per-CPU times: everything but idle and iowait; steal counts, since
              another virtual machine took those cycles)
    trial     CPU seconds of the trial's own processes: every process in the
              rank's session (each trial starts in a new session: torchrun and its
              ranks, or a rank forked by the rank server, and their workers), and
              the sessions of its other ranks on the same host

    other_cpu_share = (machine - trial) / (window seconds x CPUs)

and, on a GPU, the compute processes NVML lists on the trial's device that are not
the trial's (training_harness.measure.nvml.compute_processes). A trial is `flagged` when
another process computed on its GPU, or when others used at least QUIET_CPU_SHARE
of the CPUs while the CPUs were near full (others' and the trial's shares together
at least SATURATED_SHARE): a CPU trial's threads fill every core, so any other work
competes with it, while a GPU trial's ranks use a core each and four helper workers
beside it on a 16-core machine take nothing from it.
A process that started and ended inside the window counts as other even if it was
the trial's (its time is in the machine's figure only): the error is on the side
of flagging.

This module imports no torch: the tuner waits for a quiet machine (`wait_for_quiet`)
before it measures a flagged configuration again, and does not stop a trial for slowness
while others compete with it (`BusyWatch`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil

# Others using this much of the machine's CPUs flag a trial ... On a machine that is
# never quiet, HARNESS_QUIET_SHARE=1 keeps the figures in the records but flags nothing.
QUIET_CPU_SHARE = float(os.environ.get("HARNESS_QUIET_SHARE", "0.10"))
SATURATED_SHARE = 0.85  # ... when the CPUs were this busy in all


def cpus() -> list[int]:
    """The CPUs this process may run on (its trial's, and its children's)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU
        return list(range(psutil.cpu_count() or 1))


def machine_busy_s(cpus: Iterable[int]) -> float:
    """CPU seconds `cpus` have been busy since boot (idle and iowait left out)."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = 0.0
    for i in cpus:
        if i >= len(per_cpu):
            continue
        t = per_cpu[i]._asdict()
        total = sum(t.values()) - t.get("guest", 0.0) - t.get("guest_nice", 0.0)
        busy += total - t.get("idle", 0.0) - t.get("iowait", 0.0)
    return busy


def processes_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the live processes `pids` (threads included)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += t.user + t.system
    return total


def session_pids(sids: set[int] | None = None) -> list[int]:
    """The processes of sessions `sids` (default: this process's): one trial's processes
    (several sessions where a trial's ranks on this host were started by several
    launchers, as a two-node trial's on one machine)."""
    sids = {os.getsid(0)} if sids is None else sids
    pids = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):  # gone, or not ours to ask
            if os.getsid(pid) in sids:
                pids.append(pid)
    return pids


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    machine_s: float
    trial_s: float
    pids: tuple[int, ...]


def snapshot(cpus: list[int], pids: Callable[[], list[int]] = session_pids) -> Snapshot:
    mine = pids()
    return Snapshot(time.monotonic(), machine_busy_s(cpus), processes_cpu_s(mine), tuple(mine))


def shares(a: Snapshot, b: Snapshot, n_cpus: int) -> tuple[float, float] | None:
    """(others', ours) share of `n_cpus` CPUs between two snapshots; None for no time."""
    capacity = (b.at - a.at) * n_cpus
    if capacity <= 0:
        return None
    ours = max(b.trial_s - a.trial_s, 0.0)
    other = max(b.machine_s - a.machine_s - ours, 0.0)
    return min(other / capacity, 1.0), min(ours / capacity, 1.0)


class InterferenceMeter:
    """`start()` and `stop()` around the measured window, then `reading()`.

    `gpu_pids` lists the compute processes on the trial's device (None where NVML
    cannot say, or on a CPU); it is asked at both ends of the window.
    """

    def __init__(self, gpu_pids: Callable[[], list[dict[str, Any]] | None] | None = None,
                 pids: Callable[[], list[int]] = session_pids) -> None:
        self.cpus = cpus()
        self.gpu_pids = gpu_pids
        self.pids = pids
        self._start: Snapshot | None = None
        self._stop: Snapshot | None = None
        self._gpu: list[list[dict[str, Any]] | None] = []

    def start(self) -> None:
        self._gpu = [self.gpu_pids()] if self.gpu_pids else []
        self._start = snapshot(self.cpus, self.pids)

    def stop(self) -> None:
        self._stop = snapshot(self.cpus, self.pids)
        if self.gpu_pids:
            self._gpu.append(self.gpu_pids())

    def reading(self) -> dict[str, Any] | None:
        if self._start is None or self._stop is None:
            return None
        a, b = self._start, self._stop
        got = shares(a, b, len(self.cpus))
        if got is None:
            return None
        ours = set(a.pids) | set(b.pids)
        return interference(*got, len(self.cpus), _others_on_gpu(self._gpu, ours))


def _others_on_gpu(seen: list[list[dict[str, Any]] | None],
                   ours: set[int]) -> list[dict[str, Any]] | None:
    """Compute processes on the device that are not the trial's; None when NVML's list is
    missing, or names none of the trial's processes (PIDs of another namespace)."""
    if not seen or any(s is None for s in seen):
        return None
    listed = [p for s in seen for p in (s or [])]
    if not any(p["pid"] in ours for p in listed):
        return None
    others = {p["pid"]: p for p in listed if p["pid"] not in ours}  # each once, the last seen
    return sorted(others.values(), key=lambda p: p["pid"])


def interference(other_cpu_share: float, trial_cpu_share: float | None, cpus: int,
                 other_gpu_processes: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The record's metrics.interference."""
    saturated = other_cpu_share + (trial_cpu_share or 0.0) >= SATURATED_SHARE
    flagged = (other_cpu_share >= QUIET_CPU_SHARE and saturated) or bool(other_gpu_processes)
    return {"other_cpu_share": round(other_cpu_share, 4),
            "trial_cpu_share": None if trial_cpu_share is None else round(trial_cpu_share, 4),
            "cpus": cpus, "other_gpu_processes": other_gpu_processes, "flagged": flagged,
            "threshold": QUIET_CPU_SHARE}


def combine_ranks(readings: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One trial's interference from its ranks': the busiest rank's CPU share (ranks on one
    node see the same machine), every other GPU process, flagged if any rank was."""
    got = [r for r in readings if r]
    if not got:
        return None
    busiest = max(got, key=lambda r: r["other_cpu_share"])
    gpu_lists = [r["other_gpu_processes"] for r in got]
    gpus = None if any(g is None for g in gpu_lists) else [p for g in gpu_lists for p in g]
    out = dict(busiest, other_gpu_processes=gpus)
    out["flagged"] = any(r["flagged"] for r in got)
    return out


def machine_share_of_others(seconds: float, exclude: Callable[[], list[int]]) -> float:
    """The share of this process's CPUs used over `seconds` by processes outside `exclude()`
    (the tuner and its children, waiting): how busy the machine is without us."""
    allowed = cpus()
    a = snapshot(allowed, exclude)
    time.sleep(seconds)
    got = shares(a, snapshot(allowed, exclude), len(allowed))
    return got[0] if got else 0.0


def ours() -> list[int]:
    """This process and every process under it (a tuner's helper, rank server, workers)."""
    me = psutil.Process(os.getpid())
    try:
        return [me.pid, *(p.pid for p in me.children(recursive=True))]
    except psutil.Error:
        return [me.pid]


def wait_for_quiet(max_wait_s: float, poll_s: float = 2.0) -> tuple[bool, float, float]:
    """Wait until others (outside `ours`) use less than QUIET_CPU_SHARE of the CPUs, sampled
    every `poll_s`, or `max_wait_s`. Returns (quiet, seconds waited, others' last share)."""
    t0 = time.monotonic()
    while True:
        share = machine_share_of_others(min(poll_s, max(max_wait_s, 0.1)), ours)
        waited = time.monotonic() - t0
        if share < QUIET_CPU_SHARE or waited >= max_wait_s:
            return share < QUIET_CPU_SHARE, waited, share


class BusyWatch:
    """Since it was made (a trial's start): did others use QUIET_CPU_SHARE of the CPUs?"""

    def __init__(self) -> None:
        self.cpus = cpus()
        self.start = snapshot(self.cpus, ours)

    def __call__(self) -> bool:
        got = shares(self.start, snapshot(self.cpus, ours), len(self.cpus))
        return got is not None and got[0] >= QUIET_CPU_SHARE
