"""A full disk while a record, a trial's files or study.json are written: the study
stops with one line (exit 3), and --resume once the space is back loses nothing
(issue 26; docs/reliability.md). ENOSPC is injected into os.write and os.fsync of one
file of the run folder; the disk stays full from then on."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.tuner.conftest import SEARCH_ONLY, tune, write_study
from tests.tuner.test_torn_records import a_stopped_worker, one_readable_record_per_trial
from training_harness.records.run_store import parse_lines


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
    lines = capsys.readouterr().err.strip().splitlines()
    # before it, the study's note on the values this CPU refuses (FlexAttention's)
    err = lines[next(i for i, line in enumerate(lines) if line.startswith("harness tune:")):]
    assert len(err) == 1, lines  # one line: what happened, and how to go on
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
