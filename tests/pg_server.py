"""A throwaway PostgreSQL server for tests: its own data folder (a copy of one made
once per session), a free port on loopback, password authentication (scram), stopped
and removed after the test.

Needs Debian's `postgresql` package (.ci/run installs it); without it the tests
that use the `postgres` fixture are skipped, saying so. PostgreSQL refuses to run
as root: as root, the server runs as the `postgres` user the package creates.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

USER, PASSWORD, DATABASE = "tuner", "pw-Zq81-not-in-any-file", "studies"


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
    def __init__(self, bin_dir: Path, root: Path, template: Path | None = None):
        """A server on a new data folder under `root`; with `template`, a copy of that
        stopped server's data folder (its user, password and database made already)."""
        self.bin, self.root = bin_dir, root
        self.data, self.port = root / "data", _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            pwd.getpwnam("postgres")  # KeyError: no user to run it as
            shutil.chown(root, "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        if template is not None:
            subprocess.run(["cp", "-a", str(template), str(self.data)], check=True,
                           capture_output=True, timeout=60)  # owner and modes kept
            self.start()
            return
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_user:
            shutil.chown(pwfile, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile),
                  "-A", "scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        self.start()
        self._psql(f"CREATE DATABASE {DATABASE}")

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

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


_TEMPLATE: list[Path] = []  # the data folder every test's server starts from a copy of


def _template(bin_dir: Path) -> Path:
    """A stopped server's data folder with the user, password and database made, made
    once per session: initdb costs each test about a second, a copy a tenth of that."""
    if not _TEMPLATE:
        root = Path(tempfile.mkdtemp(prefix="harness-pg-template-"))
        root.chmod(0o755)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        server = PostgresServer(bin_dir, root)
        server.stop("fast")
        _TEMPLATE.append(server.data)
    return _TEMPLATE[0]


@pytest.fixture
def postgres():
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
            server = PostgresServer(bin_dir, root, template=_template(bin_dir))
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server")
        yield server
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped by the test
            server.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)
