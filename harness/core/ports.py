"""A free TCP port, for a rendezvous endpoint (torch-free: the tuner and the launcher use it).

Binding port 0 asks the OS for a port free now; once that socket is closed the OS may
hand the same port to the next caller, so several workers launching at once could get
the same endpoint. A port handed out here is therefore reserved: in this process (a set,
under a lock) and across the processes of this machine (a file created exclusively in
a folder of the temp dir, `RESERVE_DIR`, stale after `RESERVE_S`), and never handed out
again while reserved.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

RESERVE_S = 120.0  # a port stays reserved this long: its trial's rendezvous binds it by then
ATTEMPTS = 64
_lock = threading.Lock()
_handed: dict[int, float] = {}  # port -> when this process handed it out


def _os_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _claim_file(port: int, now: float) -> bool:
    """Create the port's reservation file exclusively; a stale one is taken over."""
    folder = Path(os.environ.get("HARNESS_PORTS_DIR")
                  or Path(tempfile.gettempdir()) / f"harness-ports-{os.getuid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / str(port)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if now - path.stat().st_mtime < RESERVE_S:
                return False  # another process of this machine holds it
            os.utime(path, (now, now))  # stale: ours now (a race here is as rare as before)
            return True
        os.close(fd)
        return True
    except OSError:
        return True  # no folder to reserve in: the process-wide set still holds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now and not handed out by this process, or another of
    this machine, in the last RESERVE_S seconds."""
    with _lock:
        now = time.time()
        for port, when in list(_handed.items()):
            if now - when >= RESERVE_S:
                del _handed[port]
        port = _os_port(host)
        for _ in range(ATTEMPTS):
            if port not in _handed and _claim_file(port, now):
                break
            port = _os_port(host)
        _handed[port] = now  # after ATTEMPTS the OS's latest choice, as before this rule
        return port
