"""What every rank process of a trial knows without torch: its place, and its launcher.

Set up by training_harness.measure.rank_main before anything else (and read by the
launcher in training_harness.launch, which sets the environment variables named here):

    RankInfo                  this process's place, from torchrun's environment
    LOG_HEADER                the first line each rank writes to its stderr
    listen_for_stack_requests on SIGUSR1, every thread's stack to a file
    watch_launcher            stop when the launcher is gone
    append_output             stdout/stderr appended, so the launcher's log cuts hold
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import os
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

# Set by training_harness.launch.local on every process of a trial: the --node-rank this node was
# launched with. c10d rendezvous numbers nodes by its own order (GROUP_RANK), so the
# launched node rank is what says which node's launcher collects the record.
NODE_RANK_ENV = "HARNESS_NODE_RANK"
# The start of the first line every rank writes to its stderr (training_harness.measure.rank_main),
# followed by RankInfo.describe(): how the launcher tells the ranks' logs apart.
LOG_HEADER = "harness worker:"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the trial, as torchrun's environment says."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0  # the node's index as the rendezvous numbered it
    launch_node_rank: int = 0  # the --node-rank this node was launched with
    host: str = field(default_factory=socket.gethostname)

    @classmethod
    def from_env(cls) -> RankInfo:
        return cls(
            rank=_env_int("RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1),
            local_rank=_env_int("LOCAL_RANK", 0),
            local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
            group_rank=_env_int("GROUP_RANK", 0),
            launch_node_rank=_env_int(NODE_RANK_ENV, 0),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def writes_result(self) -> bool:
        """The one process that writes the record: local rank 0 of launched node 0.

        On one node that is rank 0. On several nodes it is the first process on the
        node whose launcher was given --node-rank 0, so the record lands where that
        launcher looks for it, shared file system or not.
        """
        return self.launch_node_rank == 0 and self.local_rank == 0

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size}, local rank {self.local_rank}, "
            f"node {self.group_rank} (launched as {self.launch_node_rank}), host {self.host}"
        )


LAUNCH_ID_ENV = "HARNESS_LAUNCH_ID"
LAUNCHER_ENV = "HARNESS_LAUNCHER"  # "pid:create_time" of the launching process
STACKS_DIR_ENV = "HARNESS_STACKS_DIR"  # where each rank writes its stack on SIGUSR1
STACK_SIGNAL = signal.SIGUSR1


def stack_file(folder: str | os.PathLike, rank: int) -> str:
    return os.path.join(folder, f"stack-rank{rank}.txt")


def listen_for_stack_requests() -> None:
    """In a rank: on STACK_SIGNAL, write every thread's stack to this rank's stack file
    (faulthandler, in C: it answers while the main thread is stuck in a collective).

    Not on SIGTERM: a rank stopped gets several at once (the launcher's, torchrun's),
    and faulthandler's dump guards against re-entry by returning at once, so the
    second signal's chained default action often killed the rank before the first
    had written a line.
    """
    folder = os.environ.get(STACKS_DIR_ENV)
    if not folder:
        return
    global _stack_out  # faulthandler keeps the descriptor, not the file object
    _stack_out = open(stack_file(folder, int(os.environ.get("RANK", "0"))), "w")  # noqa: SIM115
    faulthandler.register(STACK_SIGNAL, file=_stack_out, all_threads=True, chain=False)


_stack_out = None


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


def append_output(fds: tuple[int, ...] = (1, 2)) -> None:
    """In a trial's process: make its stdout and stderr, where they are files, append
    (O_APPEND), so that after a cut they carry on at the file's new end."""
    for fd in fds:
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
