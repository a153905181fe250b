"""Finding and stopping every process of one launched trial.

torchrun starts each rank in a session of its own, so killing the launcher's
process group does not reach them, and a rank whose agent died is re-parented
away from it. So every process of a trial carries a tag in its environment
(HARNESS_LAUNCH_ID, inherited by torchrun's agent and its workers), and stopping
a trial stops the launched process's tree, its process group and every process
with the tag: SIGTERM first (each rank then prints its stack, see harness.worker),
SIGKILL after a grace period.

Should the launcher itself die (killed, or its machine's job ended), each rank
notices within a second (`watch_launcher`) and stops itself the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

LAUNCH_ID_ENV = "HARNESS_LAUNCH_ID"
LAUNCHER_ENV = "HARNESS_LAUNCHER"  # "pid:create_time" of the launching process


def launcher_tag() -> str:
    me = psutil.Process()
    return f"{me.pid}:{me.create_time()}"


def watch_launcher(interval_s: float = 1.0) -> None:
    """In a trial's process: stop this process (SIGTERM) once its launcher is gone."""
    tag = os.environ.get(LAUNCHER_ENV)
    if not tag:
        return
    pid, created = tag.split(":", 1)

    def gone() -> bool:
        try:
            return f"{psutil.Process(int(pid)).create_time()}" != created
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False

    def watch() -> None:
        while not gone():
            time.sleep(interval_s)
        print(f"the launcher (pid {pid}) is gone; stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-launcher", daemon=True).start()


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
        try:
            if p.pid == me or p.uids().real != uid:
                continue
            if p.environ().get(LAUNCH_ID_ENV) == launch_id and _alive(p):
                found.append(p)
        except psutil.Error:
            continue
    return found


def tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and its descendants, while they are alive."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def running_ranks(launch_id: str) -> list[int]:
    """The ranks (RANK in their environment) of this trial's workers still running."""
    ranks = set()
    for p in tagged(launch_id):
        try:
            if "harness.worker" in " ".join(p.cmdline()):
                ranks.add(int(p.environ().get("RANK", "0")))
        except (psutil.Error, ValueError):
            continue
    return sorted(ranks)


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


def stop(proc: subprocess.Popen, launch_id: str, grace_s: float) -> None:
    """Stop the launched process and everything it started; reap `proc`."""
    # While `proc` is not reaped its pid (and group id) cannot belong to anyone else.
    mine = tree(proc.pid) if proc.poll() is None else []
    procs = {p.pid: p for p in mine + tagged(launch_id)}
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: its group is its pid
    _signal(list(procs.values()), signal.SIGTERM)
    alive = _wait(list(procs.values()), grace_s)
    # Anything started while we waited, or that ignored SIGTERM.
    for p in tagged(launch_id):
        procs.setdefault(p.pid, p)
        if p not in alive:
            alive.append(p)
    _signal(alive, signal.SIGKILL)
    if proc.poll() is None:  # not reaped yet, so its group id is still its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    _wait(alive, grace_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
