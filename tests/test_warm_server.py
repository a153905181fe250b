"""The rank server kept warm between commands (training_harness.launch.warm_server): a second
`harness bench` forks from the first one's server, a refused plan leaves none behind,
a server serves only commands that match it, ends by itself when idle, and a command
whose server is gone goes on with its own. No timing here
(tests/benchmarks/bench_startup.py measures the fixed cost it saves)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from training_harness.launch import rank_server, warm_server

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--workload", "gpt", "--arg", "layers=2", "--arg", "hidden=32", "--arg", "heads=2",
        "--arg", "seq_len=16", "--arg", "vocab=64", "--steps", "2", "--warmup-steps", "1",
        "--device", "cpu"]

pytestmark = pytest.mark.skipif(not rank_server.enabled(), reason="no forkserver here")


@pytest.fixture
def runtime(monkeypatch):
    """This test's own folder of servers, with the server on; every server it started is
    ended after it. In the temp dir, not under tmp_path: a socket's path has 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="warm-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    monkeypatch.setenv(warm_server.ENV, "1")
    yield folder / f"harness-warm-{os.getuid()}"
    warm_server.stop_all()
    shutil.rmtree(folder, ignore_errors=True)


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training_harness", "bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def _servers(folder: Path) -> list[int]:
    pids = [warm_server._alive(p) for p in folder.glob("*.pid")] if folder.exists() else []
    return [pid for pid in pids if pid is not None]


def _ended(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while warm_server._alive_pid(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow  # two real benches; the light server's tests cover the protocol
@pytest.mark.timeout(300)
def test_a_second_bench_forks_from_the_first_ones_server(runtime, tmp_path):
    first = _bench(*TINY, "--out", str(tmp_path / "one"))
    assert first.returncode == 0, first.stderr[-3000:]
    [server] = _servers(runtime)  # left running by the first command, which says so
    assert f"the rank server stays up for the next `harness bench` (pid {server};" in first.stdout
    second = _bench(*TINY, "--out", str(tmp_path / "two"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "stays up" not in second.stdout  # it started nothing
    assert _servers(runtime) == [server]  # the same one: no second start
    for out in ("one", "two"):
        record = json.loads((tmp_path / out / "result.json").read_text())
        assert record["status"] == "ok", record["reason"]
    # each command's preparation and rank were forked by it, in the command's folder
    forks = [line for line in next(runtime.glob("*.log")).read_text().splitlines()
             if "forked" in line]
    assert [line.split()[4] for line in forks] == ["answer", "rank"] * 2
    assert all(line.endswith(str(ROOT)) for line in forks)
    assert warm_server.stop_all() == 1 and _ended(server, 30)
    assert not list(runtime.glob("*.sock"))


def test_a_refused_plan_leaves_no_server_running(runtime, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('workload = "gpt"\nno_such_key = 1\n')
    done = _bench(str(bad), "--device", "cpu", "--out", str(tmp_path / "never"))
    assert done.returncode == 2 and "unknown key 'no_such_key'" in done.stderr
    started = [int(p.read_text()) for p in runtime.glob("*.pid")]
    assert len(started) == 1  # it started one first thing, beside its own start
    assert _ended(started[0], 30)  # and ended it, unused, at its exit
    assert not (tmp_path / "never").exists()


@pytest.mark.timeout(240)
def test_a_light_server_forks_reports_exit_codes_and_ends_when_idle(runtime, tmp_path,
                                                                      monkeypatch):
    """The protocol, with a server that preloads nothing (its forks import what they
    use): a rank's exit status, an answer, then the idle end, its socket removed."""
    monkeypatch.setenv(warm_server.IDLE_ENV, "3")
    server = warm_server.WarmServer.start([])
    rank = server.start_rank(["--no-such-flag"], dict(os.environ), str(tmp_path / "out.log"),
                             str(tmp_path / "err.log"))
    assert rank.wait(120) == 2  # rank_main's argparse refused the flag
    assert "arguments are required" in (tmp_path / "err.log").read_text()
    answer = server.ask({"op": "no such op"}, dict(os.environ))
    assert set(answer) & {"error", "crash"} and "forked_at" in answer
    assert _ended(server.pid, 60)  # 3 s after its last fork
    assert not list(runtime.glob("*.sock")) and not list(runtime.glob("*.pid"))


@pytest.mark.timeout(240)
def test_a_command_whose_server_is_gone_goes_on_and_the_next_starts_anew(runtime, tmp_path):
    server = warm_server.WarmServer.start([])
    os.kill(server.pid, signal.SIGKILL)
    assert _ended(server.pid, 30)
    with pytest.raises(warm_server.Unavailable):
        server.start_rank(["--help"], dict(os.environ), str(tmp_path / "o"), str(tmp_path / "e"))
    rank_server._warm = server  # as `harness bench` holds it: its own server takes over
    try:
        answer = rank_server.ask({"op": "no such op"})
    finally:
        rank_server._warm = None
        rank_server._stop()
    assert set(answer) & {"error", "crash"}
    again = warm_server.WarmServer.start([])  # the killed one's socket is not in the way
    assert again.pid != server.pid
    assert again.start_rank(["--no-such-flag"], dict(os.environ), str(tmp_path / "o"),
                            str(tmp_path / "e")).wait(120) == 2


def test_a_server_serves_only_the_environment_and_code_it_started_with(monkeypatch):
    base = warm_server.key(["x"])
    assert warm_server.key(["x"]) == base
    monkeypatch.setenv("PWD", "/somewhere/else")  # a shell's cd: the fork gets its cwd
    monkeypatch.setenv(warm_server.IDLE_ENV, "5")
    assert warm_server.key(["x"]) == base
    monkeypatch.setenv("TORCH_SOMETHING", "1")
    assert warm_server.key(["x"]) != base
    monkeypatch.delenv("TORCH_SOMETHING")
    assert warm_server.key(["y"]) != base
    monkeypatch.setattr(sys, "path", [*sys.path, "/elsewhere"])
    assert warm_server.key(["x"]) != base


def test_off_by_switch_inside_slurm_and_in_a_folder_others_can_enter(runtime, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv(warm_server.ENV, "0")
    assert warm_server.WarmServer.start([]) is None
    monkeypatch.setenv(warm_server.ENV, "1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert warm_server.WarmServer.start([]) is None
    monkeypatch.delenv("SLURM_JOB_ID")
    shared = runtime
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert warm_server.folder() is None and warm_server.WarmServer.start([]) is None
    shared.chmod(0o700)
    assert warm_server.folder() == shared
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    assert warm_server.folder() is None  # its sockets' paths would not fit


def test_files_of_servers_ended_over_a_day_ago_are_pruned(tmp_path):
    for name, age in (("old", 2 * 86400), ("new", 60)):
        for suffix in (".log", ".lock", ".pid"):
            path = tmp_path / f"{name}{suffix}"
            path.write_text("999999999" if suffix == ".pid" else "")
            os.utime(path, (time.time() - age, time.time() - age))
    warm_server._prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.lock", "new.log", "new.pid"]


def test_stop_all_since_ends_only_the_servers_started_after(runtime):
    older = warm_server.WarmServer.start([])
    os.utime(next(runtime.glob("*.pid")), (time.time() - 60, time.time() - 60))
    since = time.time()
    os.environ["HARNESS_SOMETHING_ELSE"] = "1"  # another environment: another server
    try:
        newer = warm_server.WarmServer.start([])
    finally:
        del os.environ["HARNESS_SOMETHING_ELSE"]
    assert newer.pid != older.pid
    assert warm_server.stop_all(since=since) == 1
    assert _ended(newer.pid, 30) and warm_server._alive_pid(older.pid) == older.pid
