"""The rank server kept warm between commands, so that `harness bench` does not wait
for torch's import each time.

`harness bench` forks its plan's preparation and its ranks from a rank server that
imported torch and torch._dynamo once (training_harness.launch.rank_server). Started by the
command, that server costs about 4 s of the command's wall clock on a CPU machine
(docs/benchmarks/bench_startup_cpu_*). Kept warm, it costs one fork. So the first
`harness bench` starts one here, in a session of its own, and the next ones fork from
it; it ends by itself after HARNESS_WARM_SERVER_IDLE_S (default 600) seconds without
a fork, and `HARNESS_WARM_SERVER=0` turns it off. It is off inside a Slurm job (the
job's end would end it anyway). It runs no trial and never touches a device, as the
per-command server: each fork is a new process, whose memory, threads or CUDA context
never reach the next.

    server = WarmServer.start()       # None when there is none to use: fall back
    server.ask(request, env)          # as rank_server.ask
    server.start_rank(argv, env, stdout, stderr)   # as rank_server.start_rank

A server is only ever used by commands it matches exactly: its key hashes this
Python, the harness's, strategies' and kernels' files (paths, sizes, mtimes), torch's
install, sys.path and the environment (less the shell's own bookkeeping, `_VOLATILE`).
So an edit, a `pip install` or an exported variable starts a new server, and the old
one idles out. Each fork gets the command's working directory, sys.path and
environment. The socket lives in a folder only this user can enter
($XDG_RUNTIME_DIR, else the temp dir: harness-warm-UID, mode 0700); a folder anyone
else could enter is not used.

The protocol, over one Unix socket connection per fork (multiprocessing's framing):
the command sends its request; the fork sends {"pid": N}, then (for `ask`) its
answer; when the fork has ended, the server sends {"pid": N, "exit": CODE} (CODE as
Popen's returncode) and closes. `python -m training_harness.launch.warm_server --stop` ends
this user's servers.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any

from training_harness.launch import fork_child

ENV = "HARNESS_WARM_SERVER"
IDLE_ENV = "HARNESS_WARM_SERVER_IDLE_S"
IDLE_S = 600.0
NAME = "harness-warm"  # the server's process name in ps and top
# a shell's own (changed by cd), and the server's own switches
_VOLATILE = frozenset({"_", "PWD", "OLDPWD", "SHLVL", ENV, IDLE_ENV})
_SOURCES = ("harness", "strategies", "kernels")
_SUN_PATH = 107  # the longest path a Unix socket can bind (sockaddr_un, Linux)
_START_S = 30.0  # for the server's socket to appear (its start imports no torch)
_READY_S = 600.0  # for its first fork (its preload: torch on a loaded machine)


class Unavailable(Exception):
    """The warm server could not fork (gone, or never came up): use the command's own."""


def enabled(env: dict[str, str] | None = None) -> bool:
    """On unless switched off or inside a Slurm job; only where /proc tells a server's
    pid from another's (Linux)."""
    env = os.environ if env is None else env
    linux = Path("/proc/self/cmdline").exists()
    return env.get(ENV, "1") != "0" and "SLURM_JOB_ID" not in env and linux


def folder() -> Path | None:
    """This user's folder of servers, or None when it is not private to this user."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    path = base / f"harness-warm-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    private = st.st_uid == os.getuid() and not st.st_mode & 0o077
    fits = len(os.fsencode(path)) + 26 <= _SUN_PATH  # a socket's path has 108 bytes
    return path if private and fits and path.is_dir() and not path.is_symlink() else None


def key(preload: list[str], env: dict[str, str] | None = None) -> str:
    """What a server must share with a command to serve it (see the module)."""
    env = dict(os.environ if env is None else env)
    files = []
    for name in _SOURCES:
        spec = importlib.util.find_spec(name)  # finds it, imports nothing
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.py")):
                st = path.stat()
                files.append((str(path), st.st_size, st.st_mtime_ns))
    torch = importlib.util.find_spec("torch")
    installed = Path(torch.origin).with_name("version.py") if torch and torch.origin else None
    stamp = installed.stat().st_mtime_ns if installed and installed.exists() else None
    picture = {"python": [sys.executable, sys.version], "files": files,
               "torch": [str(installed), stamp], "path": sys.path, "preload": preload,
               "env": sorted((k, v) for k, v in env.items() if k not in _VOLATILE)}
    return hashlib.sha256(json.dumps(picture).encode()).hexdigest()[:20]


class WarmServer:
    """A command's handle on its warm server (see the module)."""

    def __init__(self, where: Path, pid: int, spawned: bool = False) -> None:
        self.socket = where
        self.pid = pid
        self.spawned = spawned
        self.forked = False
        if spawned:  # a command that never forks (its input refused) leaves nothing behind
            atexit.register(self._stop_unused)

    def left_running(self) -> str | None:
        """One line for the command that started this server and used it: what it left
        running, and how to end it. None otherwise."""
        if not (self.spawned and self.forked and _alive_pid(self.pid)):
            return None
        idle = float(os.environ.get(IDLE_ENV, IDLE_S))
        return (f"the rank server stays up for the next `harness bench` (pid {self.pid}; "
                f"it ends after {idle / 60:g} idle minutes; {ENV}=0 turns it off)")

    def _stop_unused(self) -> None:
        if not self.forked and _alive_pid(self.pid) is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)

    @classmethod
    def start(cls, preload: list[str]) -> WarmServer | None:
        """The running server that matches this command, or a new one started now (it
        imports in its own process: this returns at once). None when off or unusable."""
        home = folder() if enabled() else None
        if home is None:
            return None
        name = key(preload)
        where, pidfile = home / f"{name}.sock", home / f"{name}.pid"
        with open(home / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one start, however many commands at once
            pid = _alive(pidfile)
            spawned = pid is None
            if spawned:
                pid = _spawn(where, home / f"{name}.log", preload)
                pidfile.write_text(str(pid))
        return cls(where, pid, spawned)

    def start_rank(self, argv: list[str], env: dict[str, str], stdout: str,
                   stderr: str) -> WarmRank:
        conn, pid = self._fork({"op": "rank", "argv": argv, "env": env, "stdout": stdout,
                                "stderr": stderr})
        return WarmRank(conn, pid)

    def ask(self, request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        conn, _ = self._fork({"op": "answer", "request": request, "env": env})
        with contextlib.closing(conn):
            try:
                answer = json.loads(conn.recv_bytes())
            except (EOFError, OSError):
                answer = {}
            if "exit" in answer or not answer:  # it ended without answering
                return {"crash": f"the warm rank server's fork that answers "
                                 f"{request.get('op')!r} ended without an answer "
                                 f"({answer.get('exit', 'no exit status')})"}
            return answer

    def _fork(self, message: dict[str, Any]) -> tuple[Any, int]:
        message = {**message, "cwd": os.getcwd(), "path": sys.path}
        conn = self._connect()
        try:
            conn.send_bytes(json.dumps(message).encode())
            while not conn.poll(1.0):  # the server's preload, on its first fork
                if not _running(self.pid):
                    raise Unavailable(f"the warm rank server (pid {self.pid}) ended")
            first = json.loads(conn.recv_bytes())
        except (EOFError, OSError, Unavailable) as e:
            conn.close()
            raise Unavailable(f"the warm rank server did not fork: {e}") from None
        if "exit" in first:
            conn.close()
            raise Unavailable(f"its fork ended at once (exit {first['exit']})")
        self.forked = True
        return conn, int(first["pid"])

    def _connect(self) -> Any:
        """A connection to the server that has this command's stdout and stderr (an
        answering fork writes where the command would)."""
        deadline = time.monotonic() + _START_S
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket))
                socket.send_fds(sock, [b"F"], [1, 2])
                return connection.Connection(sock.detach())
            except OSError as e:  # not bound yet, or gone
                sock.close()
                if not _running(self.pid) or time.monotonic() > deadline:
                    raise Unavailable(f"no warm rank server at {self.socket}: {e}") from None
                time.sleep(0.02)


class WarmRank:
    """A rank forked by the warm server, with the part of subprocess.Popen the launcher
    uses (as rank_server.ForkedRank). Its exit status comes over the connection."""

    def __init__(self, conn: Any, pid: int) -> None:
        self._conn = conn
        self.pid = pid
        self.sentinel: int = conn.fileno()  # readable once the rank has ended
        self._code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        if self._code is None and self._conn.poll(0):
            self._read_exit()
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if self._code is None and self._conn.poll(timeout):
            self._read_exit()
        if self._code is None:
            raise subprocess.TimeoutExpired("training_harness.measure.rank_main", timeout or 0.0)
        return self._code

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def _read_exit(self) -> None:
        try:
            self._code = int(json.loads(self._conn.recv_bytes())["exit"])
        except (EOFError, OSError, KeyError, ValueError):  # the server itself ended
            with contextlib.suppress(OSError):  # its rank must not run on unwatched
                os.killpg(self.pid, signal.SIGKILL)
            self._code = -signal.SIGKILL
        self._conn.close()


def _alive(pidfile: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return _alive_pid(int(pidfile.read_text()))
    return None


def _alive_pid(pid: int) -> int | None:
    """`pid` if it is a warm server still running (not a pid reused by another)."""
    try:  # empty while its exec is under way: its arguments are not in place yet
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    ours = not cmdline or b"training_harness.launch.warm_server" in cmdline
    return pid if ours and _running(pid) else None


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _spawn(where: Path, log: Path, preload: list[str]) -> int:
    where.unlink(missing_ok=True)  # a killed server's socket (none runs: under the lock)
    _prune(where.parent)
    idle = os.environ.get(IDLE_ENV, str(IDLE_S))
    code = ("import sys; sys.path[:] = __import__('json').loads(sys.argv[1]); "
            "import training_harness.launch.warm_server as w; w.main(sys.argv[2:])")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(sys.path), str(where), idle,
             json.dumps(preload), "training_harness.launch.warm_server"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            close_fds=True)
    return proc.pid


def _prune(home: Path, age_s: float = 86400.0) -> None:
    """Forget servers that ended over a day ago: their log, lock and pid files."""
    for log in home.glob("*.log"):
        with contextlib.suppress(OSError):
            old = time.time() - log.stat().st_mtime > age_s
            if old and _alive(log.with_suffix(".pid")) is None:
                for suffix in (".pid", ".sock", ".lock", ".log"):
                    log.with_suffix(suffix).unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """The server: bind, import the preload, then fork on request until idle."""
    where, idle_s, preload = Path(argv[0]), float(argv[1]), json.loads(argv[2])
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(NAME)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(where))  # first: a command can connect while the imports run
    listener.listen(64)
    inode = where.stat().st_ino
    for name in preload:
        __import__(name)
    print(f"{NAME}: pid {os.getpid()}, ready after {time.process_time():.1f} CPU-s", flush=True)
    woken_r, woken_w = os.pipe()
    for fd in (woken_r, woken_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    children: dict[int, Any] = {}
    own = [listener.fileno(), woken_r, woken_w]
    quiet_since = time.monotonic()
    while True:
        left = None if children else quiet_since + idle_s - time.monotonic()
        if left is not None and left <= 0:
            break
        ready = connection.wait([listener, woken_r], left)
        if woken_r in ready:
            with contextlib.suppress(OSError):
                os.read(woken_r, 4096)
        if listener in ready:
            sock, _ = listener.accept()
            if _fork_for(sock, children, own):
                quiet_since = time.monotonic()
        for pid, code in _reaped():
            quiet_since = time.monotonic()
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send_bytes(json.dumps({"pid": pid, "exit": code}).encode())
                conn.close()
    with contextlib.suppress(OSError):  # a newer server may own the path by now
        if where.stat().st_ino == inode:
            where.unlink()
            where.with_suffix(".pid").unlink()
    print(f"{NAME}: idle for {idle_s:.0f} s, ended", flush=True)


def _fork_for(sock: socket.socket, children: dict[int, Any], own: list[int]) -> bool:
    """Read one request (the command's stdout and stderr, then the message) and fork for
    it (see the module). False for none."""
    fds: list[int] = []
    try:
        sock.settimeout(10.0)
        _, fds, _, _ = socket.recv_fds(sock, 1, 2)
        sock.settimeout(None)
        conn = connection.Connection(sock.detach())
        if len(fds) != 2 or not conn.poll(10.0):
            raise EOFError("no request")
        request = json.loads(conn.recv_bytes())
    except (EOFError, OSError, ValueError):
        sock.close()
        for fd in fds:
            os.close(fd)
        return False
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        children[pid] = conn
        print(f"{NAME}: forked {pid} for {request['op']} in {request.get('cwd')}", flush=True)
        return True
    try:  # the fork: nothing of the server's stays open in it
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own:
            os.close(fd)
        for other in children.values():
            other.close()
        for fd, target in zip(fds, (1, 2), strict=True):  # the command's, as its own fork
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        conn.send_bytes(json.dumps({"pid": os.getpid()}).encode())
        if request["op"] == "rank":
            conn.close()
            fork_child.run_rank(request["argv"], request["env"], request["stdout"],
                                  request["stderr"])
        fork_child.answer(request["request"], request["env"], conn)
    finally:
        os._exit(1)  # both leave by os._exit themselves


def _reaped() -> list[tuple[int, int]]:
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def stop_all(since: float | None = None) -> int:
    """End this user's warm servers (`--stop`), or those started at or after `since`
    (time.time()); how many there were."""
    home = folder()
    stopped = 0
    for pidfile in sorted(home.glob("*.pid")) if home else []:
        with contextlib.suppress(OSError):
            if since is not None and pidfile.stat().st_mtime < since:
                continue
        pid = _alive(pidfile)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                stopped += 1
        pidfile.unlink(missing_ok=True)
        pidfile.with_suffix(".sock").unlink(missing_ok=True)
    return stopped


if __name__ == "__main__":
    if sys.argv[1:] != ["--stop"]:
        raise SystemExit("usage: python -m training_harness.launch.warm_server --stop")
    print(f"stopped {stop_all()} warm rank server(s)")
