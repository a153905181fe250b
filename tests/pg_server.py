"""A throwaway PostgreSQL server for tests: one per session, on its own data folder,
a free port on loopback, password authentication (scram), stopped and removed at the
session's end; each test that asks for `postgres` gets a fresh database on it.

Needs Debian's `postgresql` package (.ci/run installs it); without it the tests
that use the `postgres` fixture are skipped, saying so. PostgreSQL refuses to run
as root: as root, the server runs as the `postgres` user the package creates.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

USER, PASSWORD = "tuner", "pw-Zq81-not-in-any-file"


def _bin_dir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bin_dir: Path, root: Path):
        """A server on a new data folder under `root`, its user and password made."""
        self.bin, self.root = bin_dir, root
        self.data, self.port = root / "data", _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            pwd.getpwnam("postgres")  # KeyError: no user to run it as
            shutil.chown(root, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_user:
            shutil.chown(pwfile, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile),
                  "-A", "scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True,
                       capture_output=True, timeout=60, cwd=self.root)

    def _psql(self, sql: str) -> None:
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                        USER, "-d", "postgres", "-c", sql], check=True, capture_output=True,
                       env=env, timeout=60)

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"),
                  "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""


def _status(server: PostgresServer) -> bool:
    """Whether the server runs (pg_ctl status exits 3 when it does not)."""
    done = subprocess.run([*server.as_user, str(server.bin / "pg_ctl"), "status", "-D",
                           str(server.data)], capture_output=True, timeout=60, cwd=server.root)
    return done.returncode == 0


def server_for_session():
    """The session's server (tests/conftest.py's `postgres_server`), started at its first
    use: a server's start and stop cost each test seconds on a loaded 2-core machine, a
    database a fraction of that."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[postgres]')")
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    root.chmod(0o755)
    try:
        try:
            server = PostgresServer(bin_dir, root)
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
        yield server
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped by a test
            server.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Database:
    """One test's database on the session's server: its `url`; `stop`, `start` and `log`
    act on the whole server (tests run one at a time, and each starts with it running)."""

    def __init__(self, server: PostgresServer, name: str):
        self.server, self.name = server, name

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.server.port}/{self.name}"

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        self.server.start()

    def stop(self, mode: str = "fast") -> None:
        self.server.stop(mode)

    def log(self) -> str:
        return self.server.log()


_DATABASES = itertools.count()


@pytest.fixture
def postgres(postgres_server):
    """A fresh database for the test on the session's server (tests/pg_server.py), which
    runs when the test starts whatever the test before did to it."""
    if not _status(postgres_server):  # stopped by a test that failed before restarting it
        postgres_server.start()
    name = f"test_{next(_DATABASES)}"
    postgres_server._psql(f"CREATE DATABASE {name}")
    yield Database(postgres_server, name)
    if not _status(postgres_server):
        postgres_server.start()
    # FORCE: a test's process left connected (a killed worker's) must not keep it
    with contextlib.suppress(subprocess.CalledProcessError):
        postgres_server._psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
