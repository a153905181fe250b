"""A trial's ranks on one node, forked from a server that has imported torch once.

A trial's process spends about 3 s importing torch, the harness and torch._dynamo
(which the optimizer's constructor imports) before its first step, once per
trial (docs/benchmarks/trial_overhead_cpu_2026-11-23.md), and torchrun adds its
own interpreter and rendezvous. So every rank of a one-node trial is a fresh fork
of a server process that imported them once: `multiprocessing`'s forkserver, with
those modules preloaded, started by the command (`harness bench`, `harness tune`)
and stopped at its exit. It never runs a trial itself, nor touches a device: each
rank is a new fork, and one trial's memory, threads or CUDA context never reach
the next. Several nodes, and Slurm's jobs, go through torchrun.

    warm_up()              # start it now: its imports overlap the command's own
    ranks = start_ranks(argv, env, logs, world_size, port, run_id)
    ranks.wait(timeout)    # every rank ended, or the first one failed
    ranks.returncode; ranks.first_failure; ranks.pids; ranks.members
    process, conn = serve(env, log)   # the torch-side helper: a fork answering requests

Each fork runs `python -m training_harness.measure.rank_main ARGV` as torchrun's worker
would: a session of its own (so stopping its process group stops what it
started), the trial's environment with torchrun's variables (`rank_env`: what
env:// init and training_harness.measure.rank_process read), its stdout, stderr and error
file in logs/rank<i>/. What torch reads from the environment at import (not at
first use, as CUDA_VISIBLE_DEVICES and the allocator's settings are) comes from
the environment the server started with; OMP_NUM_THREADS is applied in the fork.
`HARNESS_FORK_RANKS=0` turns it off (then every rank is a new interpreter).

As with any multiprocessing program, a script of the user's that calls the harness's
launch itself needs `if __name__ == "__main__":` (the forks import its __main__).

This module is imported by the tuner's process, which never imports torch: the
server imports it, in its own process.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any

from training_harness.launch import fork_child  # what each fork runs

ENV = "HARNESS_FORK_RANKS"
# torch, torch._dynamo, the strategies and the rank's modules, imported with the
# garbage collector paused (see that module)
PRELOAD = ["training_harness.measure.rank_preload"]
# What some trials import beside: a study's many trials share the server, a bench's one
# trial imports only what its plan uses (strategies.zero: ZeRO-1's optimizer).
STUDY_PRELOAD = ["torch.distributed.optim"]
# A server that only hosts the tuner's torch-side helper (its trials run elsewhere)
HELPER_PRELOAD = ["training_harness.measure.helper_preload"]

HELPER_NAME = fork_child.HELPER_NAME

_lock = threading.Lock()
_context: Any = None


def enabled() -> bool:
    """Whether one-node trials are forked (not on a platform without fork)."""
    methods = multiprocessing.get_all_start_methods()
    return os.environ.get(ENV, "1") != "0" and "forkserver" in methods


def warm_up(study: bool = True) -> None:
    """Start the server now (for a study, with STUDY_PRELOAD), so its imports overlap the
    command's own start instead of delaying the first trial. Called before the torch-side
    helper starts (`serve`), where the trials will be forked from the server: a server
    started by the helper alone preloads only what the helper uses."""
    if enabled():  # spawns it (milliseconds); it imports in its own process
        _server(PRELOAD + (STUDY_PRELOAD if study else []))


def _server(preload: list[str] = PRELOAD) -> Any:
    global _context
    with _lock:
        if _context is None:
            forking = multiprocessing.get_context("forkserver")
            forking.set_forkserver_preload(preload)
            from multiprocessing import forkserver

            forkserver.ensure_running()
            atexit.register(_stop)
            _context = forking
    return _context


def _stop() -> None:
    """At this process's exit, end the server at once. Left to itself it would notice
    the exit and then unload torch for a second or so, holding this command's stdout
    and stderr open all the while (a caller reading them to their end waits for it).
    It runs no trial: every rank forked from it has ended or been stopped by now. It is
    found as this process's child running multiprocessing's forkserver (psutil), not
    through multiprocessing's private state."""
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any("multiprocessing.forkserver" in part for part in child.cmdline()):
                child.terminate()  # the server leaves SIGTERM to its default: gone
                child.wait(timeout=5)


class ForkedRank:
    """A forked rank (or the helper: `serve`) with the part of subprocess.Popen the
    launcher and the helper's client use."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = process.pid
        self.sentinel: int = process.sentinel  # readable once the rank has ended

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("training_harness.measure.rank_main", timeout or 0.0)
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()


def start_rank(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> ForkedRank:
    """Fork `python -m training_harness.measure.rank_main ARGV` from the server (see the module)."""
    process = _server().Process(target=fork_child.run_rank,
                                args=(argv, env, stdout, stderr), name="harness-rank",
                                daemon=False)
    _start(process)
    return ForkedRank(process)


def _start(process: Any) -> None:
    with _lock:
        process.start()


def serve(env: dict[str, str], log: str) -> tuple[ForkedRank, Any]:
    """A fork of the server that answers the torch-side helper's requests (JSON bytes in,
    JSON bytes out, on the returned duplex connection) until that connection closes: the
    tuner's helper, which then imports nothing of its own. Its stdout and stderr go to
    the file `log`. A server that `warm_up` started has the trials' preload; one started
    here, the helper's only (HELPER_PRELOAD)."""
    forking = _server(HELPER_PRELOAD)
    conn, theirs = forking.Pipe(duplex=True)
    process = forking.Process(target=fork_child.serve, args=(dict(env), log, theirs),
                              name=HELPER_NAME, daemon=True)
    _start(process)
    theirs.close()
    return ForkedRank(process), conn


def rank_env(env: dict[str, str], rank: int, world_size: int, logs: Path, port: int,
             run_id: str) -> dict[str, str]:
    """`env` with what torchrun's agent gives rank `rank` of a one-node trial
    (torch.distributed.elastic's LocalElasticAgent._start_workers, and run.py's
    OMP_NUM_THREADS), its error file in logs/rank<rank>/. One rank alone gets only its
    error file, as when it runs without torchrun."""
    env = {**env, "TORCHELASTIC_ERROR_FILE": str(logs / f"rank{rank}" / "error.json")}
    if world_size == 1:
        return env
    n = str(world_size)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank), "GROUP_RANK": "0",
        "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n, "ROLE_WORLD_SIZE": n, "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),  # env://: rank 0 hosts the store
        "TORCHELASTIC_USE_AGENT_STORE": "False",  # there is no agent's store to join
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        # torchrun's default with several ranks on a node: they would fight for the cores
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    return env


def start_ranks(argv: list[str], env: dict[str, str], logs: Path, world_size: int,
                port: int, run_id: str) -> ForkedRanks:
    """Fork every rank of a one-node trial (see the module); their logs in logs/rank<i>/."""
    started: dict[int, ForkedRank] = {}
    try:
        for rank in range(world_size):
            folder = logs / f"rank{rank}"
            folder.mkdir(exist_ok=True)
            started[rank] = start_rank(argv, rank_env(env, rank, world_size, logs, port, run_id),
                                       str(folder / "stdout.log"), str(folder / "stderr.log"))
    except BaseException:  # no rank may outlive a launch that could not start them all
        for proc in started.values():
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        raise
    return ForkedRanks(started)


class ForkedRanks:
    """A trial's forked ranks, waited on as torchrun's agent would: the trial has ended
    when every rank has, or as soon as one fails (the caller then stops the others)."""

    def __init__(self, ranks: dict[int, ForkedRank]) -> None:
        self.members = ranks
        self.pids = {rank: p.pid for rank, p in ranks.items()}
        self.first_failure: tuple[int, int] | None = None  # (rank, exit code), while watched

    def _ended(self) -> dict[int, int]:
        codes = {rank: p.poll() for rank, p in self.members.items()}
        return {rank: code for rank, code in codes.items() if code is not None}

    @property
    def returncode(self) -> int | None:
        """The first failure's exit code; else 0 once all ended cleanly; else the first
        non-zero one (ranks the caller stopped); None while any runs."""
        if self.first_failure is not None:
            return self.first_failure[1]
        ended = self._ended()
        if len(ended) < len(self.members):
            return None
        return next((c for _, c in sorted(ended.items()) if c != 0), 0)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ended = self._ended()
            failed = sorted((rank, code) for rank, code in ended.items() if code != 0)
            if failed and self.first_failure is None:
                self.first_failure = failed[0]  # ended in one look: the lowest rank
            if self.first_failure is not None or len(ended) == len(self.members):
                return self.returncode
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("training_harness.measure.rank_main",
                                                timeout or 0.0)
            running = [p.sentinel for r, p in self.members.items() if r not in ended]
            connection.wait(running, left)  # wakes as soon as any rank ends
