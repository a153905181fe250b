"""Memory that a trial needs, not what the allocator cached (issue 23): each rank's
caching allocator capped at the study's budget (fake torch.cuda functions on the CPU),
expandable segments in a trial's environment unless the study turns them off, and the
within-budget rule judging a capped trial by its reserved peak plus its context."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import pytest
import torch

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.launch.local import ALLOC_CONF_ENV, allocator_env
from training_harness.measure import memory
from training_harness.measure.memory import MemoryTracker, apply_memory_cap
from training_harness.records.predicates import budget_peak_bytes, may_be_best
from training_harness.selftest.figures import _over_budget
from training_harness.study.search_space import config_key
from training_harness.study.study_file import Study
from training_harness.tune.optuna_outcome import memory_excess_bytes

GiB = 2**30
GPU = torch.device("cuda", 0)
QUICKSTART = Path(__file__).resolve().parent.parent / "studies" / "quickstart.toml"


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's allocator functions, faked: an 80 GiB device; calls are recorded."""
    calls: dict[str, list] = {"fraction": []}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "get_device_properties",
                        lambda d=None: types.SimpleNamespace(total_memory=80 * GiB))
    monkeypatch.setattr(cuda, "set_per_process_memory_fraction",
                        lambda f, d=None: calls["fraction"].append((f, d)))
    monkeypatch.setattr(cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(cuda, "mem_get_info", lambda d=None: (79 * GiB, 80 * GiB))
    monkeypatch.setattr(cuda, "memory_reserved", lambda d=None: 0)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda d=None: 53 * GiB)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda d=None: 60 * GiB)
    return calls


def test_the_cap_is_the_budget_less_the_context_as_a_fraction_of_the_device(fake_cuda):
    cap = apply_memory_cap(GPU, int(71.26 * GiB), context_bytes=GiB // 2)
    [(fraction, device)] = fake_cuda["fraction"]
    assert device == GPU
    assert fraction == pytest.approx((71.26 - 0.5) / 80)
    assert cap == pytest.approx(70.76 * GiB, abs=1)


def test_no_cap_without_a_budget_or_on_a_cpu(fake_cuda):
    assert apply_memory_cap(GPU, None) is None
    assert apply_memory_cap(torch.device("cpu"), 10 * GiB) is None
    assert fake_cuda["fraction"] == []
    apply_memory_cap(GPU, 100 * GiB)  # over the device: the whole device, no more
    assert fake_cuda["fraction"] == [(1.0, GPU)]


def test_the_record_keeps_the_cap_and_says_when_nvml_has_no_per_process_figure(
        fake_cuda, monkeypatch):
    monkeypatch.setattr(memory, "process_memory_bytes", lambda device: None)  # a container
    tracker = MemoryTracker(GPU)
    tracker.begin()  # the context: what the device used before the model, 1 GiB
    assert tracker.context_bytes == GiB and "mem_get_info" in tracker.context_source
    tracker.cap_bytes = apply_memory_cap(GPU, 70 * GiB, tracker.context_bytes)
    mem = tracker.end()
    assert mem["cap_bytes"] == 69 * GiB
    assert (mem["allocated"], mem["reserved"]) == (53 * GiB, 60 * GiB)
    assert mem["nvml_per_process"] is False
    assert mem["device_held"] == 60 * GiB and "no per-process NVML" in mem["device_held_source"]
    assert mem["context_bytes"] == GiB


def test_the_record_with_nvml_keeps_what_the_device_held(fake_cuda, monkeypatch):
    monkeypatch.setattr(memory, "process_memory_bytes", lambda device: GiB // 2)
    tracker = MemoryTracker(GPU)
    tracker.begin()
    assert tracker.context_bytes == GiB // 2 and tracker.context_source.startswith("NVML")
    mem = tracker.end(process_peak=71 * GiB)
    assert mem["device_held"] == 71 * GiB and mem["nvml_per_process"] is True
    assert mem["cap_bytes"] is None  # no budget, no cap


# --- the trial's environment ------------------------------------------------------------


def test_expandable_segments_are_on_by_default():
    assert allocator_env(Plan(), {}) == {ALLOC_CONF_ENV: "expandable_segments:True"}
    assert allocator_env(Plan(), {ALLOC_CONF_ENV: "max_split_size_mb:128"}) == {
        ALLOC_CONF_ENV: "max_split_size_mb:128,expandable_segments:True"}


def test_a_study_setting_turns_them_off_and_the_users_own_setting_is_kept():
    off = Plan(expandable_segments=False)
    assert allocator_env(off, {}) == {}
    assert allocator_env(off, {ALLOC_CONF_ENV: "max_split_size_mb:128"}) == {
        ALLOC_CONF_ENV: "max_split_size_mb:128"}
    mine = {ALLOC_CONF_ENV: "expandable_segments:False"}
    assert allocator_env(Plan(), mine) == mine


def test_the_study_setting_is_validated():
    table = tomllib.loads(QUICKSTART.read_text())
    assert Study.from_dict(table).budget.expandable_segments is True
    table["budget"] = {**table.get("budget", {}), "expandable_segments": False}
    assert Study.from_dict(table).budget.expandable_segments is False
    table["budget"]["expandable_segments"] = "no"
    with pytest.raises(HarnessError, match="expandable_segments"):
        Study.from_dict(table)


def test_the_plan_carries_the_budget_and_it_is_not_part_of_the_configuration():
    plan = Plan.from_dict(Plan(memory_budget_bytes=70 * GiB, expandable_segments=False)
                          .to_dict())
    assert plan.memory_budget_bytes == 70 * GiB and plan.expandable_segments is False
    assert config_key(plan) == config_key(Plan())
    with pytest.raises(HarnessError, match="memory_budget_bytes"):
        Plan(memory_budget_bytes=0).validate("plan")


# --- the within-budget rule -------------------------------------------------------------

BUDGET = 71.26 * GiB


def _record(held: float, memory_: dict) -> dict:
    return {"status": "ok", "trial_id": 7, "tags": {"phase": "search"},
            "metrics": {"samples_per_s": 363.0, "peak_memory_bytes": int(held),
                        "memory": memory_}}


def test_a_capped_trial_held_over_the_budget_but_needing_less_is_within_it():
    """The H100 study's fastest trial: 53 GiB allocated, 71.46 GiB held, budget 71.26."""
    rec = _record(71.46 * GiB, {"allocated": 53 * GiB, "reserved": 60 * GiB,
                                "context_bytes": GiB // 2, "cap_bytes": int(70.76 * GiB),
                                "device_held": int(71.46 * GiB)})
    assert budget_peak_bytes(rec) == 60.5 * GiB
    assert may_be_best(rec, BUDGET)
    assert memory_excess_bytes(rec, BUDGET) == pytest.approx(-(BUDGET - 60.5 * GiB))
    assert _over_budget([rec], BUDGET) == []


def test_an_uncapped_trial_is_judged_by_what_the_device_held():
    rec = _record(71.46 * GiB, {"allocated": 53 * GiB, "reserved": 60 * GiB,
                                "context_bytes": GiB // 2, "cap_bytes": None})
    assert not may_be_best(rec, BUDGET)
    assert memory_excess_bytes(rec, BUDGET) == pytest.approx(0.2 * GiB, rel=1e-6)
    assert [o["trial_id"] for o in _over_budget([rec], BUDGET)] == [7]


def test_a_capped_trial_that_needed_more_than_the_budget_is_over_it():
    rec = _record(75 * GiB, {"allocated": 70 * GiB, "reserved": 71 * GiB,
                             "context_bytes": GiB, "cap_bytes": int(70.26 * GiB)})
    assert not may_be_best(rec, BUDGET) and memory_excess_bytes(rec, BUDGET) > 0


def test_without_a_per_process_figure_reserved_plus_context_is_checked():
    rec = _record(60 * GiB, {"allocated": 53 * GiB, "reserved": 60 * GiB,
                             "context_bytes": 2 * GiB, "cap_bytes": int(69 * GiB),
                             "nvml_per_process": False})
    assert budget_peak_bytes(rec) == 62 * GiB and may_be_best(rec, BUDGET)


def test_the_reports_frame_judges_by_the_same_figure():
    from training_harness.reports.frame import flatten

    rec = _record(71.46 * GiB, {"allocated": 53 * GiB, "reserved": 60 * GiB,
                                "context_bytes": GiB // 2, "cap_bytes": int(70.76 * GiB)})
    row = flatten({**rec, "plan": Plan().to_dict()}, 0, "7")
    assert row["budget_memory_bytes"] == 60.5 * GiB < BUDGET < row["peak_memory_bytes"]


def test_the_corrected_estimator_learns_what_a_capped_trial_needed():
    from training_harness.tune.model.correction import Correction

    rec = _record(71.46 * GiB, {"allocated": 53 * GiB, "reserved": 60 * GiB,
                                "context_bytes": GiB // 2, "device_base": GiB // 2,
                                "cap_bytes": int(70.76 * GiB)})
    rec["predicted"] = {"peak_memory_bytes": 30 * GiB}
    c = Correction.from_records([rec], "cuda")
    assert c.memory_ratio == pytest.approx(2.0)  # reserved 60 GiB over 30 predicted
    assert c.runtime_bytes == GiB // 2
