"""One-rank trials forked from a server that has imported torch once.

A trial's process spends about 3 s importing torch, the harness and torch._dynamo
(which the optimizer's constructor imports) before its first step, once per
trial (docs/benchmarks/trial_overhead_cpu_2026-11-23.md). So a one-rank trial is
a fresh fork of a server process that imported them once: `multiprocessing`'s
forkserver, with those modules preloaded. It never runs a trial itself, nor
touches a device: each trial is a new fork, and one trial's memory, threads or
CUDA context never reach the next. Several ranks still go through torchrun.

    proc = start_rank(argv, env, stdout_path, stderr_path)   # Popen's face
    proc.wait(timeout); proc.poll(); proc.pid

The fork runs `python -m harness.measure.rank_main ARGV` as a new process would:
a session of its own (so stopping its process group stops what it started), the
trial's environment, its stdout and stderr in the given files. What torch reads
from the environment at import (not at first use, as CUDA_VISIBLE_DEVICES and the
allocator's settings are) comes from the environment the server started with.
`HARNESS_FORK_RANKS=0` turns it off (then every rank is a new interpreter).

This module is imported by the tuner's process, which never imports torch: the
server imports it, in its own process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
from multiprocessing import spawn
from typing import Any

ENV = "HARNESS_FORK_RANKS"
PRELOAD = ["torch", "torch._dynamo", "strategies", "harness.measure.rank_main",
           "harness.measure.trial_loop"]

_lock = threading.Lock()
_context: Any = None


def enabled() -> bool:
    """Whether one-rank trials are forked (not on a platform without fork)."""
    methods = multiprocessing.get_all_start_methods()
    return os.environ.get(ENV, "1") != "0" and "forkserver" in methods


def warm_up() -> None:
    """Start the server now, in the background, so its imports overlap the caller's
    own work (preparing the plan) instead of delaying the first trial."""
    if enabled():
        threading.Thread(target=_server, name="rank-server", daemon=True).start()


def _server() -> Any:
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            from multiprocessing import forkserver

            forkserver.ensure_running()
            _context = ctx
    return _context


class ForkedRank:
    """A forked rank with the part of subprocess.Popen the launcher uses."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("harness.measure.rank_main", timeout or 0.0)
        return self._process.exitcode


def start_rank(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> ForkedRank:
    """Fork `python -m harness.measure.rank_main ARGV` from the server (see the module)."""
    ctx = _server()
    process = ctx.Process(target=_run_rank, args=(argv, env, stdout, stderr),
                          name="harness-rank", daemon=False)
    with _lock:
        # multiprocessing would have the fork run the caller's __main__ again (to
        # unpickle what it defines): the rank's code is the harness's own, and a user's
        # script without a main guard must not start over in every trial.
        spawn.get_preparation_data = _without_main
        try:
            process.start()
        finally:
            spawn.get_preparation_data = _preparation_data
    return ForkedRank(process)


_preparation_data = spawn.get_preparation_data


def _without_main(name: str) -> dict[str, Any]:
    data = _preparation_data(name)
    data.pop("init_main_from_path", None)
    data.pop("init_main_from_name", None)
    return data


def _run_rank(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the fork: become the rank process `python -m harness.measure.rank_main` would
    be, then leave with its exit status (os._exit: nothing of the server runs after)."""
    code = 1
    try:
        os.setsid()
        os.environ.clear()
        os.environ.update(env)
        for fd, path in ((1, stdout), (2, stderr)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = ["harness.measure.rank_main", *argv]
        from harness.core.errors import HarnessError
        from harness.measure import rank_main

        try:
            code = rank_main.main(argv)
        except HarnessError as e:
            print(f"{rank_main.HEADER} error: {e}", file=sys.stderr)
            code = e.exit_code
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
