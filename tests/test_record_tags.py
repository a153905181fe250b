"""The record's tags (training_harness.records.tags), the questions asked of records
(training_harness.records.predicates) and the record of a trial that measured nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_type_hints

from training_harness.records import tags as T
from training_harness.records.predicates import finished, is_reference, may_be_best, ranked
from training_harness.records.result import TrialResult, empty_metrics
from training_harness.records.tags import Tags, tags_of

ROOT = Path(__file__).resolve().parent.parent


def test_the_values_on_disk_stay_as_they_were():
    assert T.REFERENCE_PHASES == ("baseline", "known-good", "search")
    assert (T.CONFIRM, T.ABLATION, T.VARIANT) == ("confirm", "ablation", "variant")
    assert (T.PRUNED_MEMORY, T.PRUNED_REFUSED, T.PRUNED_SLOW, T.PRUNED_TIME) == (
        "memory", "refused", "slow", "time")
    assert set(get_type_hints(Tags)) == {
        "phase", "optuna_number", "pruned", "deadline", "orphan", "unreachable", "stale",
        "retry_of", "duplicate_of", "remeasured", "confirm", "ablation", "variant", "cluster"}


def test_tags_of_a_record_without_tags_is_empty():
    assert tags_of({}) == {} and tags_of({"tags": None}) == {}
    assert tags_of({"tags": {"phase": "search"}}) == {"phase": "search"}


def test_tags_are_read_through_tags_of_only():
    pattern = re.compile(r"""\.get\(\s*["']tags["']\s*\)\s*or\b""")
    found = [f"{p.relative_to(ROOT)}:{i}"
             for top in ("harness", "reports", "tests", "strategies")
             for p in sorted((ROOT / top).rglob("*.py")) if p != ROOT / "harness/records/tags.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"use training_harness.records.tags.tags_of: {found}"


def record(status="ok", trial_id=1, rate=1.0, peak=None, **tags):
    return {"status": status, "trial_id": trial_id, "tags": tags,
            "metrics": {**empty_metrics(), "samples_per_s": rate, "peak_memory_bytes": peak}}


def test_the_predicates():
    assert finished(record()) and finished(record("pruned", pruned="memory"))
    assert not finished(record("pruned", pruned="time"))
    assert not finished(record("timeout", deadline=True))
    assert not finished(record("failed", orphan=True))
    assert is_reference(record(phase="known-good")) and not is_reference(record(phase="confirm"))
    assert may_be_best(record(peak=100), 100) and not may_be_best(record(peak=101), 100)
    assert may_be_best(record(peak=101), None) and not may_be_best(record("oom"), None)
    busy = record()
    busy["metrics"]["interference"] = {"flagged": True, "other_cpu_share": 0.5}
    assert not may_be_best(busy, None)
    rows = ranked([record(trial_id=1, rate=1.0, phase="search"),
                   record(trial_id=2, rate=3.0, phase="baseline"),
                   record(trial_id=3, rate=9.0, phase="ablation"),
                   record(trial_id=4, rate=9.0, phase="search", duplicate_of=2),
                   record("failed", trial_id=5, phase="search")])
    assert [r["trial_id"] for r in rows] == [2, 1]


def test_a_trial_that_measured_nothing():
    r = TrialResult.not_measured("pruned", "why", study="s", trial_id=3, plan={"a": 1},
                                 predicted=None, metrics={"exit_code": 2})
    d = r.to_dict()
    assert d["metrics"] == {**empty_metrics(), "exit_code": 2}
    assert d["env"] == {} and d["tags"] == {} and d["duration_s"] == 0.0 and d["started_at"]
    assert TrialResult.not_measured("failed", "x", study=None, trial_id=1, plan={},
                                    predicted=None, started_at="").started_at == ""
