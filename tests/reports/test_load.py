"""Records -> frames: study folders, bench folders, damaged and partial records."""

from __future__ import annotations

import json
import math

import pytest

from tests.reports.runs import GiB, synthetic_records, write_run
from training_harness.core.errors import HarnessError
from training_harness.reports.load import load_run


def test_study_folder_reads_every_record_and_the_study(tmp_path):
    recs = synthetic_records(40, study="s1")
    run = load_run(write_run(tmp_path / "s1", recs))
    assert run.kind == "study" and run.name == "s1"
    assert len(run.trials) == len(recs)
    assert list(run.trials.index) == [str(r["trial_id"]) for r in recs]
    assert run.baseline_id == "0" and run.baseline_note == "the study's baseline trial"
    assert run.best_id == str(json.loads((tmp_path / "s1/study.json").read_text())["best_trial_id"])
    assert run.memory_budget == 12 * GiB
    row = run.trials.loc["0"]
    assert row["config"] == "fp32, no strategies" and row["layout"] == "1x1x1"
    assert row["phase"] == "baseline" and row["samples_per_s"] > 0
    abl = run.trials[run.trials["phase"] == "ablation"]
    assert len(abl) and abl["ablation_of"].eq(run.best_id).all()
    assert run.notes == []


def test_bench_folder_is_a_study_of_one_trial(tmp_path):
    rec = synthetic_records(1)[0]
    rec.update(study=None, trial_id=None, tags={})
    (tmp_path / "result.json").write_text(json.dumps(rec))
    for path in (tmp_path, tmp_path / "result.json"):
        run = load_run(path)
        assert run.kind == "bench" and list(run.trials.index) == ["bench"]
        assert run.name == rec["plan"]["name"]
        assert run.best_id == "bench" and run.baseline_id == "bench"
        assert "not tagged" in run.baseline_note


def test_damaged_lines_and_other_schemas_are_skipped_and_named(tmp_path):
    recs = synthetic_records(5)
    run_dir = write_run(tmp_path / "s", recs)
    lines = (run_dir / "trials.jsonl").read_text().splitlines()
    lines.insert(2, json.dumps({**recs[1], "schema": 2, "trial_id": 99}))
    lines.append(lines[-1][:50])  # a trial still being written
    (run_dir / "trials.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(run_dir)
    assert len(run.trials) == len(recs)
    assert any("schema 2" in n for n in run.notes)
    assert any("still being written" in n for n in run.notes)


def test_missing_optional_keys_become_empty_values(tmp_path):
    minimal = {"schema": 1, "status": "failed", "trial_id": 1, "reason": None}
    odd = {"schema": 1, "status": "ok", "trial_id": 2, "plan": {"strategies": ["amp"]},
           "metrics": {"samples_per_s": "nan", "peak_memory_bytes": "inf", "loss": None}}
    (tmp_path / "trials.jsonl").write_text(json.dumps(minimal) + "\n" + json.dumps(odd) + "\n")
    run = load_run(tmp_path)
    assert run.kind == "study" and len(run.trials) == 2
    assert any("no study.json" in n for n in run.notes)
    t = run.trials
    assert t.loc["1", "config"] == "fp32, no strategies" and t.loc["1", "reason_short"] == ""
    assert math.isnan(t.loc["2", "samples_per_s"]) and t.loc["2", "peak_memory_bytes"] == math.inf
    assert t.loc["2", "config"] == "amp"
    assert run.best_id is None  # nothing measured


def test_result_files_are_read_when_trials_jsonl_is_missing(tmp_path):
    run_dir = write_run(tmp_path / "s", synthetic_records(6), journal=False)
    (run_dir / "trials.jsonl").unlink()
    run = load_run(run_dir)
    assert len(run.trials) == 6 and any("no trials.jsonl" in n for n in run.notes)


def test_a_repeated_trial_id_keeps_the_last_record(tmp_path):
    recs = synthetic_records(3)
    again = {**recs[2], "status": "timeout", "reason": "again"}
    run = load_run(write_run(tmp_path / "s", [*recs, again], journal=False))
    assert len(run.trials) == 3 and run.trials.loc["2", "status"] == "timeout"
    assert any("more than once" in n for n in run.notes)


def test_a_folder_with_no_records_is_a_users_mistake(tmp_path):
    with pytest.raises(HarnessError, match="no study.json"):
        load_run(tmp_path)
    with pytest.raises(HarnessError, match="no such folder"):
        load_run(tmp_path / "absent")


def test_best_and_baseline_without_study_json(tmp_path):
    recs = synthetic_records(30, ablation=False)
    for r in recs:
        r["tags"] = {}
    run_dir = write_run(tmp_path / "s", recs, journal=False)
    (run_dir / "study.json").unlink()
    run = load_run(run_dir)
    ok = run.trials[run.trials["status"] == "ok"]
    assert run.best_id == ok["samples_per_s"].idxmax()
    assert "chosen by the report" in run.best_note
    assert run.baseline_id == "0" and "not tagged" in run.baseline_note
