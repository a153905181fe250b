"""trials.jsonl survives a torn write, a full disk and a tuner killed at any moment.

Each test ends with the one check: every trial the study started (every trial in the
storage but the queue's leftovers) has exactly one readable record, none is RUNNING,
and trials.jsonl parses whole (issue 26; docs/reliability.md).

    a torn last line, cut at several points (before its trial id, mid-line, inside
        a multi-byte UTF-8 character, its newline alone missing; a record glued onto
        a torn one, as an older harness wrote; no result.json to record it again
        from), then --resume
    a full disk: ENOSPC injected into os.write / os.fsync of one file of the run
        folder (a record, result.json, plan.toml, study.json at the start and at
        the end), the disk full from then on: exit 3, one line; --resume once the
        space is back
    kill -9 of the tuner (a fork of this process) at a moment a seed picks among
        its writes (a record, a trial's files, study.json, Optuna's tell, a launch;
        half the time a record is torn first, as a power loss would), then --resume

Studies run in this process with the fake launcher (tests/tuner/fake_launch.py).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from harness.launch import torch_helper
from harness.records import run_store
from harness.records.result import TrialResult
from harness.records.run_store import RunStore, parse_lines
from harness.tune.recovery.workers import Worker
from harness.tune.tuner_state import TunerState
from tests.tuner import fake_launch
from tests.tuner.conftest import SEARCH_ONLY, tune, write_study


def started_trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal")))
    trials = optuna.load_study(study_name="quickstart", storage=storage).get_trials()
    return [t for t in trials if t.state != TrialState.WAITING]


def one_readable_record_per_trial(out: Path) -> list[dict]:
    """The check every test ends with; returns the records."""
    data = (out / "trials.jsonl").read_bytes()
    records, bad = parse_lines(out / "trials.jsonl", data)
    assert bad == [] and data.endswith(b"\n"), bad
    trials = started_trials(out)
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    counts = Counter(r["tags"]["optuna_number"] for r in records)
    assert counts == Counter(t.number for t in trials), (counts, [t.number for t in trials])
    return records


def a_stopped_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's first study is a worker that has since stopped (a pid since taken
    by another process), as a killed tuner's is when --resume runs."""
    me = Worker.this()
    gone = Worker(me.host, me.pid, me.created - 100)
    monkeypatch.setattr(Worker, "this", classmethod(lambda cls: gone))


# --- a torn last line ------------------------------------------------------------------
_FINISHED: dict[str, Path] = {}


@pytest.fixture
def finished_study(tmp_path_factory) -> Path:
    """A study of 4 trials run to its end, once for the module (each test copies it)."""
    if "out" not in _FINISHED:
        root = tmp_path_factory.mktemp("finished")
        path = write_study(root, budget={**SEARCH_ONLY, "n_trials": 4}, sampler="random")
        assert tune(str(path), "--out", str(root / "run"), "--budget", "10m") == 0
        _FINISHED["out"] = root / "run"
    return _FINISHED["out"]


def tear(out: Path, case: str) -> tuple[dict, bytes, int]:
    """Cut trials.jsonl's last line as `case` says; returns that line's record, the
    bytes left of it, and its first byte."""
    path = out / "trials.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[-1])
    line = lines[-1].rstrip(b"\n")
    if case == "before-its-trial-id":
        kept = line[:12]
    elif case in ("mid-line", "no-result-json"):
        kept = line[:len(line) // 2]
    elif case == "inside-a-utf8-character":
        # The harness writes JSON's \u escapes (ASCII only); a line another tool wrote
        # may hold UTF-8: cut inside its 4-byte character.
        text = json.dumps({**record, "reason": "mesuré 😀 ok"}, ensure_ascii=False)
        line = text.encode()
        kept = line[:line.index("😀".encode()) + 2]
    elif case == "its-newline-alone":
        kept = line
    elif case == "glued":  # an older harness: the next record written onto torn bytes
        record = json.loads(lines[-2])
        kept = lines[-2][:len(lines[-2]) // 3]
        path.write_bytes(b"".join(lines[:-2]) + kept + lines[-1])
        return record, kept, len(b"".join(lines[:-2]))
    else:
        raise AssertionError(case)
    path.write_bytes(b"".join(lines[:-1]) + kept)
    if case == "no-result-json":
        (out / "trials" / str(record["trial_id"]) / "result.json").unlink()
    return record, kept, len(b"".join(lines[:-1]))


CUTS = ["before-its-trial-id", "mid-line", "inside-a-utf8-character", "its-newline-alone",
        "glued", "no-result-json"]


@pytest.mark.parametrize("case", CUTS)
def test_resume_after_a_torn_last_line(finished_study, tmp_path, capsys, monkeypatch, case):
    from harness.cli.main import main
    from reports.load import load_run

    out = tmp_path / "run"
    shutil.copytree(finished_study, out)
    record, kept, cut_at = tear(out, case)
    before = (out / "trials.jsonl").read_bytes()
    number = record["tags"]["optuna_number"]
    line_no = before[:cut_at].count(b"\n") + 1
    if case != "its-newline-alone":  # the report names the line and its bytes
        notes = " ".join(load_run(out).notes)
        assert f"trials.jsonl line {line_no} (byte {cut_at})" in notes, notes
        assert f"{len(kept)} bytes" in notes, notes
    if case == "mid-line":  # and `harness report` says so (the page itself aside)
        capsys.readouterr()
        monkeypatch.setattr("reports.report.build_report", lambda run: "")
        assert main(["report", str(out), "--out", str(tmp_path / "report.html")]) == 0
        assert f"trials.jsonl line {line_no} (byte {cut_at})" in capsys.readouterr().err
    capsys.readouterr()

    assert tune("--resume", "--out", str(out), "--budget", "10m") == 0
    err = capsys.readouterr().err
    records = one_readable_record_per_trial(out)
    mine = [r for r in records if r["tags"]["optuna_number"] == number]
    assert len(mine) == 1
    copies = sorted(out.glob("trials.jsonl.torn-*"))
    if case == "its-newline-alone":  # a whole record: its line ended, nothing cut
        assert copies == [] and mine[0] == json.loads(kept)
        return
    assert [c.name for c in copies] == [f"trials.jsonl.torn-{cut_at}-line{line_no}"]
    assert copies[0].read_bytes() == before[cut_at:].split(b"\n")[0]  # the bytes, kept
    assert f"trials.jsonl line {line_no} (byte {cut_at})" in err and copies[0].name in err
    assert (out / "trials.jsonl").read_bytes().startswith(before[:cut_at])  # before: as it was
    if case == "glued":  # the record written onto the torn one stays
        assert json.loads(before.splitlines()[-1][len(kept):]) in records
    if case == "no-result-json":  # settled as a trial whose record never came
        assert mine[0]["status"] == "failed" and mine[0]["reason"].startswith("record torn")
        assert copies[0].name in mine[0]["reason"] and mine[0]["tags"]["orphan"]
        again = [r for r in records if r["tags"].get("retry_of") == number]
        assert len(again) == 1 and again[0]["status"] == "ok"
    else:  # recorded again from its result.json, as it was
        assert mine[0] == record or case == "inside-a-utf8-character"
        assert mine[0]["status"] == "ok"
    # settled once: a second --resume cuts and records nothing more
    capsys.readouterr()
    after = (out / "trials.jsonl").read_bytes()
    assert tune("--resume", "--out", str(out), "--budget", "10m") == 0
    assert "torn" not in capsys.readouterr().err
    assert (out / "trials.jsonl").read_bytes() == after


def test_resume_an_append_after_a_torn_line_cuts_it_first(tmp_path):
    """A record is never written onto torn bytes (a writer died mid-line): they are
    kept beside the file and cut out, the new line starts on a line of its own."""
    store = RunStore(tmp_path)
    store.create("")
    said = []
    store.say = said.append
    for i in range(2):
        store.append({"study": "s", "trial_id": i, "status": "ok"})
    whole = store.trials_jsonl.read_bytes()
    with open(store.trials_jsonl, "ab") as f:
        f.write(b'{"study": "s", "trial_id": 2, "sta')
    store.append({"study": "s", "trial_id": 3, "status": "ok"})
    assert store.trials_jsonl.read_bytes() == whole + b'{"study": "s", "trial_id": 3, ' \
                                                      b'"status": "ok"}\n'
    (copy,) = tmp_path.glob("trials.jsonl.torn-*")
    assert copy.read_bytes() == b'{"study": "s", "trial_id": 2, "sta'
    assert len(said) == 1 and "line 3" in said[0] and copy.name in said[0]


def test_resume_a_short_write_is_finished_and_a_failed_one_taken_back(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    store.create("")
    real = os.write
    calls = []

    def short(fd, data):  # the kernel may write less than asked: the rest follows
        calls.append(len(data))
        return real(fd, bytes(data[:max(len(data) // 2, 1)]))

    monkeypatch.setattr(os, "write", short)
    store.append({"study": "s", "trial_id": 0, "status": "ok", "plan": {"x": "y" * 100}})
    assert len(calls) > 2 and store.records()[0]["plan"]["x"] == "y" * 100
    whole = store.trials_jsonl.read_bytes()

    def full(fd, data):  # some bytes, then the disk is full
        if len(data) < 50:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bytes(data[:40]))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as raised:
        store.append({"study": "s", "trial_id": 1, "status": "ok", "plan": {"x": "y" * 100}})
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == str(store.trials_jsonl)  # the message names the file
    assert store.trials_jsonl.read_bytes() == whole  # the partial line taken back out


# --- a full disk ---------------------------------------------------------------------
def full_disk(monkeypatch: pytest.MonkeyPatch, out: Path, name: str, call: str,
              nth: int) -> list[str]:
    """The disk fills at the `nth` `call` (os.write or os.fsync) on a file of `out`
    whose name starts with `name` (a write gets half its bytes in first, as a filling
    disk's short write); from then on every os.write and os.fsync into `out` fails with
    ENOSPC. Returns the file it filled at."""
    write, fsync = os.write, os.fsync
    seen, filled = [], []

    def path_of(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def check(fd: int, data: bytes | None) -> int | None:
        where = path_of(fd)
        if not where.startswith(str(out)):
            return None
        if filled:
            full()
        if Path(where).name.startswith(name) and (data is None) == (call == "fsync"):
            seen.append(where)
            if len(seen) == nth:
                filled.append(where)
                if data is not None and len(data) > 1:
                    return write(fd, bytes(data[:len(data) // 2]))
                full()
        return None

    def writing(fd, data):
        n = check(fd, data)
        return write(fd, data) if n is None else n

    def syncing(fd):
        check(fd, None)
        return fsync(fd)

    monkeypatch.setattr(os, "write", writing)
    monkeypatch.setattr(os, "fsync", syncing)
    return filled


DISK_FULL_AT = [  # (case, the file's name begins, the call, the nth such call)
    ("a-record", "trials.jsonl", "write", 3),
    # the 2nd trial's record, by the tuner (the fake launcher wrote the 3rd result.json)
    ("result-json", ".result-", "fsync", 4),
    ("plan-toml", ".plan.toml.", "write", 3),
    ("study-json-at-the-start", ".study.json.", "write", 1),
    ("study-json-at-the-end", ".study.json.", "write", 2),
]


@pytest.mark.parametrize("case, name, call, nth", DISK_FULL_AT,
                         ids=[c[0] for c in DISK_FULL_AT])
def test_chaos_full_disk_stops_with_one_line_then_resume_loses_nothing(
        tmp_path, monkeypatch, capsys, case, name, call, nth):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={**SEARCH_ONLY, "n_trials": 4}, sampler="random")
    with monkeypatch.context() as patched:
        a_stopped_worker(patched)
        filled = full_disk(patched, out, name, call, nth)
        assert tune(str(path), "--out", str(out), "--budget", "10m") == 3
    assert filled, "the disk should have filled"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line: what happened, and how to go on
    assert err[0].startswith("harness tune: error: cannot write ") and \
        "(No space left on device): the study stops" in err[0], err
    assert f"harness tune --resume --out {out}" in err[0]
    before = (out / "trials.jsonl").read_bytes()
    assert parse_lines(out / "trials.jsonl", before)[1] == []  # no partial line left

    # the space is back
    assert tune("--resume", "--out", str(out), "--budget", "10m") == 0
    assert (out / "trials.jsonl").read_bytes().startswith(before)  # nothing lost
    records = one_readable_record_per_trial(out)
    assert sum(r["status"] == "ok" and r["tags"]["phase"] == "search" for r in records) >= 2
    info = json.loads((out / "study.json").read_text())
    assert info["finished_at"] and info["n_trials"] == len(records)
    assert (out / "best.toml").is_file()


# --- kill -9 at random moments -----------------------------------------------------------
# The tuner's writes a kill may land before or after (Optuna's own are inside its
# tell; a kill between ask() and the worker tag is not tried: docs/reliability.md).
MOMENTS = [(RunStore, "append"), (run_store, "write_atomic"), (TrialResult, "write"),
           (TunerState, "tell"), (fake_launch, "launch")]


def at_each_moment(monkeypatch: pytest.MonkeyPatch, tick) -> None:
    """`tick(name, args)` before and after each of MOMENTS."""
    for owner, name in MOMENTS:
        real = getattr(owner, name)

        def wrapped(*args, _real=real, _name=name, **kw):
            tick(f"before {_name}", args)
            value = _real(*args, **kw)
            tick(f"after {_name}", args)
            return value

        monkeypatch.setattr(owner, name, wrapped)


def kill_study(path: Path, out: Path, moment: int, tear: float | None) -> int:
    """Run the study in a fork of this process, killed (SIGKILL) at its `moment`-th
    tick; a record about to be appended then is torn first at fraction `tear` of its
    line. Returns how the fork ended (the signal, or 0: the study ended first)."""
    pid = os.fork()
    if pid == 0:  # the tuner
        try:
            # It asks this process's torch-side helper (started by `moments`), which it
            # cannot wait for (not its child: Popen.poll would call it ended), and which
            # no kill interrupts mid-question (kills land at the ticks only).
            helper = torch_helper.shared()
            if helper._proc is not None:
                helper._proc.poll = lambda: None
            ticks = [0]

            def tick(name, args):
                ticks[0] += 1
                if ticks[0] != moment:
                    return
                if name == "before append" and tear is not None:  # power lost mid-line
                    store, record = args[0], args[1]
                    line = (json.dumps(record.to_dict() if isinstance(record, TrialResult)
                                       else record) + "\n").encode()
                    with open(store.trials_jsonl, "ab") as f:
                        f.write(line[:max(int(len(line) * tear), 1)])
                os.kill(os.getpid(), signal.SIGKILL)

            with pytest.MonkeyPatch.context() as patched:
                at_each_moment(patched, tick)
                tune(str(path), "--out", str(out), "--budget", "10m")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


@pytest.fixture
def moments(tmp_path_factory, monkeypatch) -> tuple[Path, list[str]]:
    """The study the kill tests run, and its ticks, in order, run whole (in this
    process: it also starts the torch-side helper the forks share)."""
    root = tmp_path_factory.mktemp("whole")
    path = write_study(root, budget={"ablation_repeats": 1, "confirm_repeats": 0,
                                     "n_trials": 4}, sampler="random")
    ticks: list[str] = []
    with monkeypatch.context() as patched:
        at_each_moment(patched, lambda name, args: ticks.append(name))
        assert tune(str(path), "--out", str(root / "run"), "--budget", "10m") == 0
    return path, ticks


def test_chaos_kill_9_at_random_moments_then_resume(moments, tmp_path, capsys):
    path, ticks = moments
    appends = [i + 1 for i, name in enumerate(ticks) if name == "before append"]
    for seed in range(4):
        rng = random.Random(seed)
        out = tmp_path / f"run-{seed}"
        if seed % 2:  # power lost while a record was written: torn at a random byte
            moment, tear = rng.choice(appends), rng.uniform(0.01, 0.99)
        else:
            moment, tear = rng.randint(1, len(ticks)), None
        ended = kill_study(path, out, moment, tear)
        # (0: this run ticked fewer times than the one counted, and ended first)
        assert ended in (signal.SIGKILL, 0), (seed, moment, len(ticks))
        if not (out / "study.toml").exists():
            continue  # killed before the run folder was made: nothing to resume
        assert tune("--resume", "--out", str(out), "--budget", "10m") == 0, (seed, moment)
        records = one_readable_record_per_trial(out)
        err = capsys.readouterr().err
        torn = sorted(out.glob("trials.jsonl.torn-*"))
        assert bool(torn) == (tear is not None and ended != 0), (seed, torn)
        assert all(c.name in err for c in torn), (seed, err)
        assert any(r["tags"]["phase"] == "ablation" for r in records), seed
