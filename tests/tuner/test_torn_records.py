"""trials.jsonl survives a torn write (issue 26; docs/reliability.md).

A torn last line, cut at several points (before its trial id, mid-line, inside a
multi-byte UTF-8 character, its newline alone missing; a record glued onto a torn
one, as an older harness wrote; no result.json to record it again from), then
--resume; an append after a torn line; a short or failed write. A full disk:
test_full_disk.py; kill -9 at random moments: test_kill_9_moments.py.

Each study test ends with the one check (`one_readable_record_per_trial`): every
trial the study started (every trial in the storage but the queue's leftovers) has
exactly one readable record, none is RUNNING, and trials.jsonl parses whole.
Studies run in this process with the fake launcher (tests/tuner/fake_launch.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.tuner.conftest import SEARCH_ONLY, tune, write_study
from training_harness.records.run_store import RunStore, parse_lines
from training_harness.tune.workers import Worker


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
    from training_harness.cli.main import main
    from training_harness.reports.load import load_run

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
        monkeypatch.setattr("training_harness.reports.report.build_report", lambda run: "")
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
