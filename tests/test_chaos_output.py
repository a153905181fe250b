"""Chaos: a trial that floods its output costs the launcher neither memory nor the disk.

The flooding trials (tests.faulty_workload's flood_mb) are launched from a driver
process of their own, so that its peak RSS (ru_maxrss) is the launcher's alone;
the driver also samples what the log files take on disk while the trial runs.
The log cap is 8 MiB here (HARNESS_LOG_CAP_BYTES) so that 320 MB of output is
cut many times over. Select these tests with `-k chaos`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys

import pytest

from tests.distributed.launch_helpers import ROOT, assert_nothing_left, faulty_plan, needs_ddp
from training_harness.core.errors import HarnessError
from training_harness.launch.log_cap import CAP_ENV, KEEP_BYTES, LogCap, cap_bytes, disk_bytes
from training_harness.launch.rank_logs import tail
from training_harness.measure.prepare import prepare
from training_harness.measure.rank_process import append_output

CAP = 8 * 2**20
MB = 10**6
SLACK = 64 * 2**10  # what a file may hold past the cap: the marker, a last line
GROWTH = 64 * 2**20  # the most the launcher's peak RSS may grow while a trial floods
HEADER = "harness worker: rank"

# The plan is prepared in the test's process (torch is imported there already) and
# handed over as JSON, as the tuner gets it from its torch-side helper: the driver, like
# the tuner, never imports torch (an interpreter's worth of imports, ~3.5 CPU-s a test,
# saved). The peak RSS after the launch, less the one before it, is what launching the
# flooding trial cost.
DRIVER = r"""
import contextlib, json, resource, sys, threading
from pathlib import Path
from training_harness.core.prepared import PreparedPlan
from training_harness.launch.local import launch
from training_harness.launch.log_cap import disk_bytes

out, prepared = Path(sys.argv[1]), PreparedPlan.from_dict(json.loads(sys.argv[2]))
assert "torch" not in sys.modules
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
peak_disk, done = {}, threading.Event()

def sample():
    while not done.wait(0.05):
        with contextlib.suppress(OSError):
            for p in (out / "logs").rglob("*.log"):
                with contextlib.suppress(OSError):
                    peak_disk[p.name] = max(peak_disk.get(p.name, 0), disk_bytes(p.stat()))

threading.Thread(target=sample, daemon=True).start()
result = launch(prepared, out, "chaos")
done.set()
print(json.dumps({"status": result.status, "reason": result.reason,
                  "metrics": result.metrics, "rss_before": before,
                  "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_disk": peak_disk}))
"""


def run_flood(out, fork: bool = True, **plan) -> dict:
    """Launch the faulty plan from a driver process (its ranks forked from the rank
    server, or without `fork` a new interpreter each, under torchrun); its report."""
    env = {**os.environ, CAP_ENV: str(CAP), "HARNESS_FORK_RANKS": "1" if fork else "0"}
    prepared = json.dumps(prepare(faulty_plan(**plan)).checked().to_dict())
    done = subprocess.run([sys.executable, "-c", DRIVER, str(out), prepared], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in report.items() if k != "metrics"}, indent=1))
    return report


def check_bounded(out, report, flood_bytes: int, flooded: int) -> list:
    """The launcher's memory and the logs on disk stayed bounded; the flooded logs
    were cut, keep their first lines and end in the latest output. Their paths."""
    growth = report["rss_peak"] - report["rss_before"]
    assert growth < GROWTH, f"the launcher's RSS grew by {growth} bytes"
    assert growth < flood_bytes / 4
    logs = list((out / "logs").rglob("*.log"))
    for path in logs:  # apparent size too: the ranks' output appends (O_APPEND)
        st = path.stat()
        assert st.st_size <= CAP + SLACK and disk_bytes(st) <= CAP + SLACK, path
    cut = [p for p in logs if "[harness: log cut at " in p.read_text()]
    assert len(cut) == flooded, cut
    for path in cut:  # (what was written after the last cut, under the cap, stays)
        assert "flood done:" in path.read_text()
        if path.name == "stdout.log":
            assert path.read_text().splitlines()[-1].startswith("flood done:")
        else:
            assert path.read_text().startswith(HEADER)  # the head is kept
    assert_nothing_left(out)
    return cut


def cuts(path) -> int:
    """How many times `path` was cut, from its marker."""
    return int(re.search(r"log cut at \d+ bytes \(cut (\d+);", path.read_text()).group(1))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_chaos_flood_of_a_single_process_that_finishes(tmp_path):
    out = tmp_path / "flood-ok"
    # 320 MB over about 3 s: the launcher cuts the logs while they are written.
    report = run_flood(out, world=1, flood_mb=300, flood_stderr_mb=20, flood_s=3.0)
    assert report["status"] == "ok", report["reason"]
    cut = check_bounded(out, report, 320 * MB, flooded=2)
    stdout = out / "logs" / "rank0" / "stdout.log"
    assert stdout in cut and cuts(stdout) >= 2  # and the trial went on writing after each
    assert tail(out / "logs" / "rank0" / "stderr.log").rstrip().endswith("finished: ok")
    assert report["peak_disk"]["stdout.log"] < 300 * MB / 2


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_chaos_flood_of_a_single_process_that_dies(tmp_path):
    out = tmp_path / "flood-dies"
    report = run_flood(out, world=1, flood_mb=300, flood_stderr_mb=20, exit_rank=0)
    assert report["status"] == "failed"
    reason = report["reason"]
    assert reason.startswith("the trial process ended (exit code 3) and wrote no record")
    # It quotes the latest lines of the stderr: the flood's last line, and no more.
    assert reason.splitlines()[-1] == "flood done: 300 MB to stdout, 20 MB to stderr on rank 0"
    assert len(reason) < 2000 and len(report["metrics"]["stderr_tail"]) <= 4000
    assert set(report["metrics"]["logs_cut"]) == {"rank0/stdout.log", "rank0/stderr.log"}
    check_bounded(out, report, 320 * MB, flooded=2)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fork", [False, True], ids=["through-torchrun", "forked"])
def test_chaos_flood_of_two_ranks(tmp_path, fork):
    needs_ddp()
    out = tmp_path / "flood-ddp"
    # Each rank 150 MB + 10 MB over about 3 s in its first step; rank 1 raises in
    # its second (after the first step's all-reduce: both ranks are done flooding).
    report = run_flood(out, fork, world=2, flood_mb=150, flood_stderr_mb=10, flood_s=3.0,
                       fail_rank=1, fail_at_step=1)
    assert report["status"] == "failed"
    reason = report["reason"]
    first, *quoted = reason.splitlines()
    assert first == "rank 1 failed: RuntimeError: injected failure on rank 1 at step 1"
    assert quoted[0].startswith("last lines of its stderr")
    # The quote ends at the traceback's last line, even when the rank then aborted
    # on its way out (gloo's threads sometimes do): that is summed up in one line.
    error_at = max(i for i, line in enumerate(quoted) if line.endswith(first.split(": ", 1)[1]))
    assert error_at == len(quoted) - 1 or (
        error_at == len(quoted) - 2 and quoted[-1].startswith("[then "))
    assert len(reason) < 2000
    assert len(report["metrics"]["logs_cut"]) == 4
    cut = check_bounded(out, report, 320 * MB, flooded=4)
    # torchrun opens the ranks' files without O_APPEND (a fork's are opened with it);
    # the ranks add it, so the files cut while they were written stay small (checked
    # above), holes and all.
    assert max(cuts(p) for p in cut if p.name == "stdout.log") >= 2


def write_lines(f, n: int, what: str) -> None:
    f.write("".join(f"{what} {i}\n" for i in range(n)).encode())
    f.flush()


def collapse_works_here(folder) -> bool:
    """Whether the file system under `folder` takes ranges out of files (ext4, XFS)."""
    from training_harness.launch.log_cap import COLLAPSE_RANGE, _fallocate

    probe = folder / "probe"
    probe.write_bytes(b"x" * (3 * os.statvfs(folder).f_bsize))
    with open(probe, "r+b") as f:
        works = _fallocate(f.fileno(), COLLAPSE_RANGE, 0, os.statvfs(folder).f_bsize)
    probe.unlink()
    return works


@pytest.mark.parametrize("how", ["collapse", "rewrite"])
@pytest.mark.parametrize("mode", ["ab", "wb"])
def test_chaos_cut_keeps_head_marker_and_latest_output(tmp_path, monkeypatch, mode, how):
    """A writer that appends carries on at the cut file's end; one that does not
    leaves a hole, which takes no disk and which `tail` skips. Both ways of cutting:
    in the kernel where the file system can, by rewriting the file elsewhere."""
    if how == "rewrite":
        monkeypatch.setattr("training_harness.launch.log_cap._fallocate", lambda *args: False)
    elif not collapse_works_here(tmp_path):
        pytest.skip(f"the file system under {tmp_path} cannot collapse ranges")
    path = tmp_path / "stderr.log"
    caps = LogCap(tmp_path, cap=2**20)
    with open(path, mode) as f:
        write_lines(f, 1, "header")
        write_lines(f, 200_000, "old")  # 2 MB
        caps.check(force=True)
        assert caps.cuts == {path: 1}
        write_lines(f, 3, "new")
        text = path.read_bytes().replace(b"\0", b"").decode()
        assert text.startswith("header 0\nold 0\n")
        assert "[harness: log cut at " in text and "old 199999\nnew 0\nnew 1\nnew 2\n" in text
        # tail reads the last 8 KiB: after a hole, from the first whole line there.
        assert tail(path).endswith("new 1\nnew 2\n") and "\0" not in tail(path)
        assert disk_bytes(path.stat()) < KEEP_BYTES + 64 * 2**10
        if mode == "ab":
            assert tail(path).endswith("old 199999\nnew 0\nnew 1\nnew 2\n")
            assert path.stat().st_size < KEEP_BYTES + 16 * 2**10
        write_lines(f, 200_000, "more")
        caps.check(force=True)
        assert caps.cuts[path] == 2 and disk_bytes(path.stat()) < KEEP_BYTES + 64 * 2**10
        assert "(cut 2;" in tail(path, 10 * 2**20)
        assert tail(path).endswith("more 199999\n")
    assert list(caps.summary()) == ["stderr.log"]


def test_chaos_cuts_while_a_writer_appends_lose_and_move_nothing(tmp_path):
    """Lines appended while the file is cut, some in two writes as print makes them
    (its text, then the newline): after the last marker, every line is there, in
    order, whole. (The rewriting cut cannot promise this: see training_harness.launch.log_cap.)"""
    import threading

    if not collapse_works_here(tmp_path):
        pytest.skip(f"the file system under {tmp_path} cannot collapse ranges")
    path, n = tmp_path / "stdout.log", 300_000
    caps = LogCap(tmp_path, cap=2**16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, b"header\n")

    def write():
        for i in range(n):
            if i % 7:
                os.write(fd, b"line %d\n" % i)
            else:
                os.write(fd, b"line %d" % i)
                os.write(fd, b"\n")

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        caps.check(force=True)
    os.close(fd)
    caps.check(force=True)
    assert caps.cuts[path] > 10  # the cuts raced the writer many times
    text = path.read_bytes().decode()
    assert text.startswith("header\nline 0\n")
    after = text.rsplit("[harness: log cut at ", 1)[1].split("\n")[2:-1]  # whole lines
    numbers = [int(line.removeprefix("line ")) for line in after]
    assert numbers == list(range(numbers[0], n)), "a line was lost or moved"


def test_chaos_small_logs_are_not_cut_and_checks_are_spaced(tmp_path):
    (tmp_path / "stdout.log").write_text("x\n" * 1000)
    (tmp_path / "other.txt").write_text("x" * 2**21)
    caps = LogCap(tmp_path, cap=2**20, every_s=60)
    caps.check()
    (tmp_path / "stdout.log").write_text("x\n" * 2**20)
    caps.check()  # too soon after the last look
    assert caps.cuts == {}
    caps.check(force=True)
    assert list(caps.cuts) == [tmp_path / "stdout.log"]


def test_chaos_append_output_and_the_cap_setting(tmp_path, monkeypatch):
    with open(tmp_path / "out.log", "wb") as f:
        append_output((f.fileno(),))
        assert fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_APPEND
    monkeypatch.delenv(CAP_ENV, raising=False)
    assert cap_bytes() == 64 * 2**20
    monkeypatch.setenv(CAP_ENV, "8MiB")
    assert cap_bytes() == CAP and LogCap(tmp_path).cap == CAP
    monkeypatch.setenv(CAP_ENV, "lots")
    with pytest.raises(HarnessError, match=CAP_ENV):
        cap_bytes()
