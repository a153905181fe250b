"""One reader of the run folder: RunStore, the reports and the selftest name a torn line
of trials.jsonl (none skips it silently), and read record values with one coercion."""

from __future__ import annotations

import json
import math

import pandas as pd

from training_harness.records.jsonl_lines import read_trials
from training_harness.records.run_store import RunStore
from training_harness.records.values import get, number
from training_harness.selftest import figures


def _record(i: int) -> dict:
    return {"schema": 1, "study": "s", "trial_id": i, "status": "ok", "reason": None,
            "plan": {"micro_batch_size": 4, "layout": {"data": 1}},
            "metrics": {"samples_per_s": 10.0 + i, "step_time_s": {"median": 0.1}}}


def _folder_with_a_torn_line(tmp_path):
    """Two whole records, then trial 2's record cut short (its writer died)."""
    line = json.dumps(_record(2))
    (tmp_path / "trials.jsonl").write_text(
        json.dumps(_record(0)) + "\n" + json.dumps(_record(1)) + "\n" + line[:60])
    (tmp_path / "study.json").write_text(json.dumps({"name": "s", "objective": "throughput"}))
    return tmp_path


def test_the_reader_names_a_torn_line(tmp_path):
    trials = read_trials(_folder_with_a_torn_line(tmp_path) / "trials.jsonl")
    assert [r["trial_id"] for r in trials.dicts()] == [0, 1]
    assert [n for n, _ in trials.records] == [1, 2]
    [note] = trials.notes()
    assert "line 3" in note and "cut short" in note and "trial 2" in note


def test_run_store_names_a_torn_line_and_cuts_it_out(tmp_path):
    store = RunStore(_folder_with_a_torn_line(tmp_path))
    records, bad = store.read()
    assert [r["trial_id"] for r in records] == [0, 1]
    assert [(u.line, u.torn) for u in bad] == [(3, True)]
    said: list[str] = []
    store.say = said.append
    store.append(_record(3))  # the torn tail is cut out first, and said
    assert len(said) == 1 and "line 3" in said[0]
    assert [r["trial_id"] for r in store.records()] == [0, 1, 3]
    # the cut line stays named: its copy beside the file, for every reader after
    [note] = read_trials(store.trials_jsonl).notes()
    assert "kept in" in note and "trial 2" in note


def test_the_report_names_a_torn_line(tmp_path):
    from training_harness.reports.load import load_run

    run = load_run(_folder_with_a_torn_line(tmp_path))
    assert len(run.trials) == 2
    assert len(run.unreadable) == 1 and "line 3" in run.unreadable[0]
    assert run.unreadable[0] in run.notes


def test_the_selftest_names_a_torn_line(tmp_path, capsys):
    path = _folder_with_a_torn_line(tmp_path) / "trials.jsonl"
    notes: list[str] = []
    assert [r["trial_id"] for r in figures.read_jsonl(path, notes)] == [0, 1]
    assert len(notes) == 1 and "line 3" in notes[0]
    assert capsys.readouterr().err == ""  # the caller shows them
    assert len(figures.read_jsonl(path)) == 2  # no list given: a warning line instead
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "line 3" in err


def test_the_selftest_page_shows_a_torn_line(tmp_path):
    from training_harness.selftest.markdown import tune_section

    (tmp_path / "tune").mkdir()
    _folder_with_a_torn_line(tmp_path / "tune")
    state = {"phases": {"tune": {"dir": "tune", "budget_s": 60}}}
    page = "\n".join(tune_section(tmp_path, state))
    assert "trials.jsonl line 3" in page and "cut short" in page


def test_one_number_coercion():
    assert number(3) == 3.0 and number(2.5) == 2.5 and number("1.5") == 1.5
    assert number(float("inf")) == math.inf and number("inf") == math.inf
    assert number(float("inf"), finite=True) is None and number("-inf", finite=True) is None
    for not_a_number in (None, True, False, float("nan"), "nan", "fast", pd.NA, {}, [1]):
        assert number(not_a_number) is None, not_a_number
    # the reports and the selftest page use it
    from training_harness.reports import frame, style
    assert style.num is number and frame.number is number
    assert figures.num("2") == 2.0 and figures.num(math.inf) is None


def test_one_dotted_get():
    record = {"a": {"b": 1, "none": None}, "c": 0}
    assert get(record, "a.b") == 1 and get(record, "c") == 0
    assert get(record, "a.none", "x") == "x" and get(record, "a.missing", "x") == "x"
    assert get(record, "a.b.c") is None and get(None, "a") is None
    from training_harness.reports import frame
    assert frame.get is get and figures.get is get
