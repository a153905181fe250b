"""RunStore.read parses only what was appended since its last read, and gives what a
whole parse gives: after appends, a torn tail, a rewritten (repaired) file."""

from __future__ import annotations

import json

from training_harness.records.run_store import RunStore, parse_lines


def _line(i: int) -> bytes:
    return (json.dumps({"trial_id": i, "status": "ok", "text": "é" * i}) + "\n").encode()


def _same_as_a_whole_parse(store: RunStore) -> None:
    records, bad = store.read()
    whole, whole_bad = parse_lines(store.trials_jsonl, store.trials_jsonl.read_bytes())
    assert records == whole
    assert [(u.line, u.offset, u.torn) for u in bad] == \
        [(u.line, u.offset, u.torn) for u in whole_bad]


def test_incremental_reads_match_a_whole_parse(tmp_path):
    store = RunStore(tmp_path)
    path = store.trials_jsonl
    assert store.read() == ([], [])
    path.write_bytes(_line(0) + _line(1))
    _same_as_a_whole_parse(store)
    with open(path, "ab") as f:
        f.write(_line(2) + _line(3)[:9])  # a torn tail
    _same_as_a_whole_parse(store)
    assert [r["trial_id"] for r in store.records()] == [0, 1, 2]
    with open(path, "ab") as f:
        f.write(_line(3)[9:] + b"not json\n" + _line(4))  # a damaged line inside
    _same_as_a_whole_parse(store)
    assert [r["trial_id"] for r in store.records()] == [0, 1, 2, 3, 4]
    path.write_bytes(_line(7) + _line(8))  # rewritten: not the prefix read before
    _same_as_a_whole_parse(store)
    assert [r["trial_id"] for r in store.records()] == [7, 8]


def test_a_replaced_file_has_the_mode_open_would_give_it(tmp_path):
    """A run folder is read by a team and by other nodes' jobs: write_atomic's file is not
    mkstemp's 0600 but what the umask lets open() make (0644 under the usual 022)."""
    import os

    from training_harness.records.run_store import write_atomic

    old = os.umask(0o022)
    try:
        os.umask(old)
        path = tmp_path / "plan.toml"
        write_atomic(path, "x = 1\n")
        assert path.read_text() == "x = 1\n"
        assert path.stat().st_mode & 0o777 == 0o666 & ~old
        write_atomic(path, "x = 2\n")  # replaced whole, the mode again
        assert path.stat().st_mode & 0o777 == 0o666 & ~old
        assert [p.name for p in tmp_path.iterdir()] == ["plan.toml"]  # no temporary left
    finally:
        os.umask(old)
