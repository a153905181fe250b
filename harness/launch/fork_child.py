"""What a fork of the command's rank server (training_harness.launch.rank_server) runs: a
rank, as `python -m training_harness.measure.rank_main ARGV` would be (`run_rank`), or the
torch-side helper's loop (`serve`). Each takes the caller's environment (`use_env`) and
leaves by os._exit, so nothing of the server runs after.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

HELPER_NAME = "harness-helper"  # the torch-side helper's process name (see `serve`)


def run_rank(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the fork: become the rank process `python -m training_harness.measure.rank_main` would
    be, then leave with its exit status (os._exit: nothing of the server runs after)."""
    code = 1
    try:
        os.setsid()
        use_env(env)
        redirect(stdout, stderr)
        sys.argv = ["training_harness.measure.rank_main", *argv]
        from training_harness.core.errors import HarnessError
        from training_harness.measure import rank_main

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


def serve(env: dict[str, str], log: str, conn: Any) -> None:
    """In the fork (see `serve`): the torch-side helper's loop, then os._exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner decides what stops
    with contextlib.suppress(OSError):  # its name in ps and top (its command line is the
        Path("/proc/self/comm").write_text(HELPER_NAME)  # server's, as every fork's)
    use_env(env)
    redirect(log, log)
    from training_harness.measure import torch_helper_server

    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the tuner closed its end, or ended
            break
        answer = torch_helper_server.answer(request)
        conn.send_bytes(json.dumps(answer, default=str).encode())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def redirect(stdout: str, stderr: str) -> None:
    """In a fork: stdin from /dev/null, stdout and stderr appended to these files, and
    a resource tracker of its own (`own_resource_tracker`) that reports to them."""
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    own_resource_tracker()


def own_resource_tracker() -> None:
    """In a fork: multiprocessing's resource tracker of its own, started when first
    needed, not the command's, inherited through the server. What the fork leaves
    behind by os._exit (the semaphores of torch's compile workers) is then cleaned and
    reported by its own tracker into its own log, rather than at the command's exit on
    the user's terminal (on the H200 each `harness tune` ended with "There appear to be
    5 leaked semaphore objects")."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    if tracker is not None and hasattr(tracker, "_fd") and hasattr(tracker, "_pid"):
        tracker._fd = tracker._pid = None  # the inherited one's pipe is left as it is


def use_env(env: dict[str, str]) -> None:
    """In a fork: the caller's environment in place of the server's."""
    os.environ.clear()
    os.environ.update(env)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # a new interpreter reads it at import;
        import torch  # this one imported torch in the server (preloaded: no cost here)

        torch.set_num_threads(int(threads))
