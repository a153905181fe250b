"""One step of the selftest: a subprocess with a timeout, its output teed to a log.

The child runs in its own session; at its timeout (or on Ctrl-C here) it and every
process below it — trial ranks start their own sessions, so they are found by
parentage, not by group — get SIGTERM, then SIGKILL 15 s later.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

GRACE_S = 15.0


@dataclass
class Step:
    command: str  # as a shell would read it
    rc: int | None
    seconds: float
    log: str  # the log file, relative to the out folder where it lies under it
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _copy(source: IO[bytes], log: IO[str], echo: bool) -> None:
    try:
        for raw in iter(source.readline, b""):
            line = raw.decode("utf-8", "replace")
            log.write(line)
            log.flush()
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    except (ValueError, OSError):  # the log was closed: the step is over
        return


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to `proc` and everything below it, SIGKILL to what is left after GRACE_S."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def run_logged(argv: list[str], log: Path, timeout_s: float, *, root: Path | None = None,
               echo: bool = True, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> Step:
    """Run `argv` (in `cwd`) until it ends or `timeout_s` passes; its stdout and stderr go
    to `log` (and here, when `echo`). Never raises for what the child does."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(argv)
    shown = str(log.relative_to(root)) if root and log.is_relative_to(root) else str(log)
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    timed_out = False
    with open(log, "w", encoding="utf-8") as f:
        f.write(f"$ {command}\n")
        f.flush()
        if echo:
            print(f"$ {command}   (up to {timeout_s:.0f} s; log: {log})", flush=True)
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                    cwd=cwd)
        except OSError as e:
            f.write(f"[selftest] could not start: {e}\n")
            return Step(command, None, 0.0, shown)
        reader = threading.Thread(target=_copy, args=(proc.stdout, f, echo), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_tree(proc)
            rc = proc.wait()
        except KeyboardInterrupt:
            stop_tree(proc)
            raise
        reader.join(timeout=10)  # a grandchild may still hold the pipe: do not wait on it
        seconds = time.monotonic() - start
        note = f", stopped at its {timeout_s:.0f} s limit" if timed_out else ""
        f.write(f"[selftest] exit code {rc}{note}, {seconds:.1f} s\n")
    return Step(command, rc, round(seconds, 1), shown, timed_out)
