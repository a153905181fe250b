"""Finding and stopping every process of one launched trial.

torchrun starts each rank in a session of its own, so killing the launcher's
process group does not reach them, and a rank whose agent died is re-parented
away from it; a rank forked from the rank server is its server's child, in a
session of its own, and its /proc environment is the server's (so the launcher
names it by pid: `known`). So every process of a trial carries a tag in its environment
(HARNESS_LAUNCH_ID, inherited by torchrun's agent and its workers), and stopping
a trial stops the launched process's tree, its process group and every process
with the tag: SIGTERM first, SIGKILL after a grace period. Before a trial that ran
out of time is stopped, each rank is asked for its stack (`dump_stacks`).

Should the launcher itself die (killed, or its machine's job ended), each rank
notices within a second (`watch_launcher`) and stops itself the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil

from training_harness.measure.rank_process import LAUNCH_ID_ENV, STACK_SIGNAL, stack_file


def launcher_tag() -> str:
    me = psutil.Process()
    return f"{me.pid}:{me.create_time()}"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tagged(launch_id: str) -> list[psutil.Process]:
    """Live processes of this user whose environment carries `launch_id`."""
    found = []
    me, uid = os.getpid(), os.getuid()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid == me or p.uids().real != uid:
                continue
            if p.environ().get(LAUNCH_ID_ENV) == launch_id and _alive(p):
                found.append(p)
    return found


def tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and its descendants, while they are alive."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def workers(launch_id: str, known: dict[int, int] | None = None) -> dict[int, psutil.Process]:
    """This trial's workers still running, by rank (RANK in their environment); `known`
    adds ranks by pid (a forked rank: its /proc environment is its server's)."""
    found = {}
    for rank, pid in (known or {}).items():
        with contextlib.suppress(psutil.Error):
            if _alive(p := psutil.Process(pid)):
                found[rank] = p
    for p in tagged(launch_id):
        with contextlib.suppress(psutil.Error, ValueError):
            if "training_harness.measure.rank_main" in " ".join(p.cmdline()):
                found[int(p.environ().get("RANK", "0"))] = p
    return found


def dump_stacks(launch_id: str, folder: str | os.PathLike, wait_s: float = 2.0,
                known: dict[int, int] | None = None) -> None:
    """Ask every running rank for its stack (one signal each: see
    listen_for_stack_requests) and wait, at most `wait_s`, until each has written it."""
    asked = workers(launch_id, known)
    _signal(list(asked.values()), STACK_SIGNAL)
    files = [stack_file(folder, rank) for rank in asked]
    deadline, sizes = time.monotonic() + wait_s, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = [os.path.getsize(f) if os.path.exists(f) else 0 for f in files]
        if all(now) and now == sizes:  # every file written, and no longer growing
            return
        sizes = now


def _signal(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    return alive


def stop(started: list[Any], launch_id: str, grace_s: float) -> None:
    """Stop the launched processes (Popen, or ranks forked in sessions of their own) and
    everything they started; reap them."""
    # While one is not reaped its pid (and group id) cannot belong to anyone else.
    running = [p for p in started if p.poll() is None]
    procs = {p.pid: p for p in [q for p in running for q in tree(p.pid)] + tagged(launch_id)}
    if not procs:  # a trial that ended whole: no process of it is left to start another
        for p in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=grace_s)
        return
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)  # a session of its own: its group is its pid
    _signal(list(procs.values()), signal.SIGTERM)
    alive = _wait(list(procs.values()), grace_s)
    # Anything started while we waited, or that ignored SIGTERM.
    for p in tagged(launch_id):
        procs.setdefault(p.pid, p)
        if p not in alive:
            alive.append(p)
    _signal(alive, signal.SIGKILL)
    for p in started:
        if p.poll() is None:  # not reaped yet, so its group id is still its own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    _wait(alive, grace_s)
    for p in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace_s)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """In the main thread, SIGTERM raises KeyboardInterrupt while the block runs, as
    Ctrl-C would: whatever the block started (a Slurm job, trials in threads) is
    stopped on the way out instead of left to run its time. Elsewhere it does nothing
    (only the main thread may set a signal handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
