"""tf32: the flags reach torch during each step and are restored after; refused on a CPU
with the reason; the baseline is named strict fp32, and the summary and the report give
the speedup over fp32+TF32 where such a trial was measured."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.reports.runs import plan as run_plan
from tests.reports.runs import record, write_run
from tests.tiny import tiny_gpt
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.reports.headline import headline
from training_harness.reports.load import load_run
from training_harness.strategies import registry
from training_harness.strategies.base import Phase
from training_harness.strategies.compose import compose, reasons_against
from training_harness.strategies.setup import Setup
from training_harness.strategies.tf32 import Tf32Settings, tf32_enabled
from training_harness.tune.final import summary

CPU = RuntimeEnv.detect("cpu")


def test_refused_on_a_cpu_with_the_reason():
    reasons = reasons_against(Plan(device="cpu", strategies={"tf32": {}}), CPU)
    assert len(reasons) == 1 and "tf32 is a CUDA tensor-core format" in reasons[0]
    assert "strict fp32" in reasons[0]


def test_allowed_on_cuda_ampere_or_newer(monkeypatch):
    monkeypatch.setattr("training_harness.strategies.tf32.cuda_capability", lambda: (9, 0))
    h100 = replace(CPU, device_type="cuda", device_name="NVIDIA H100")
    tf32 = registry.get("tf32")
    assert tf32.check(Tf32Settings(), Plan(), h100) == []
    monkeypatch.setattr("training_harness.strategies.tf32.cuda_capability", lambda: (7, 0))
    (reason,) = tf32.check(Tf32Settings(), Plan(), replace(h100, device_name="V100"))
    assert "compute capability 8.0" in reason and "7.0" in reason


def test_the_flags_reach_torch_during_the_step_and_are_restored():
    """apply() (what compose calls on CUDA) sets them around each step only."""
    workload = tiny_gpt(layers=1)
    torch.manual_seed(0)
    model = workload.build_model()
    setup = compose(model, {}, "cpu")  # the optimizer and the step, built on the CPU
    registry.get("tf32").apply(Phase.STEP, setup, Tf32Settings())
    assert any("tf32" in n for n in setup.notes)
    seen = []

    def loss_fn(m, batch):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return workload.loss(m, batch)

    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    try:
        setup.step([workload.batch(2, 0, "cpu")], loss_fn)
        assert seen == [("high", True)]
        assert torch.get_float32_matmul_precision() == before[0]
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = before[1]


def test_a_failing_step_restores_them_too():
    setup = Setup(model=torch.nn.Linear(2, 2), device=torch.device("cpu"))
    setup.step_contexts.append(lambda: tf32_enabled(Tf32Settings("medium")))

    def boom(m, batch):
        assert torch.get_float32_matmul_precision() == "medium"
        raise RuntimeError("boom")

    before = torch.get_float32_matmul_precision()
    setup.optimizer = torch.optim.SGD(setup.model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        setup.step([None], boom)
    assert torch.get_float32_matmul_precision() == before


def _records():
    import random

    rng = random.Random(0)
    base = record("t", 0, run_plan("baseline", {}, 8), rng, "baseline")
    tf32 = record("t", 1, run_plan("tf32", {"tf32": {}}, 8), rng, "search")
    best = record("t", 2, run_plan("amp", {"amp": {"dtype": "bf16"}}, 8), rng, "search")
    base["metrics"]["samples_per_s"], tf32["metrics"]["samples_per_s"] = 10.0, 20.0
    best["metrics"]["samples_per_s"] = 50.0
    return [base, tf32, best]


def test_the_summary_names_strict_fp32_and_the_tf32_speedup():
    recs = _records()
    assert summary.tf32_reference(recs, recs[0])["trial_id"] == 1
    assert summary.tf32_line(recs, recs[0], 50.0).startswith("  2.50x fp32+TF32 (trial 1")
    assert summary.tf32_line(recs[:1] + recs[2:], recs[0], 50.0) == ""  # none measured
    decision = {"standings": {"0": {"median": 10, "min": 10, "max": 10, "n": 1},
                              "2": {"median": 50, "min": 50, "max": 50, "n": 1}},
                "best": "2", "baseline_id": "0", "median": 50, "n": 1,
                "baseline": {"median": 10}, "indistinguishable": []}
    text = summary.confirmation_text(decision)
    assert "strict fp32 baseline" in text and "5.00x the strict fp32 baseline's median" in text


def test_the_report_names_strict_fp32_and_the_tf32_speedup(tmp_path):
    recs = _records()
    h = headline(load_run(write_run(tmp_path / "run", recs, name="t")))
    assert h.speedup == pytest.approx(5.0) and h.tf32_speedup == pytest.approx(2.5)
    assert h.tf32_id == "1"
    assert "strict fp32 baseline" in h.verdict and "2.50× as fast as fp32+TF32" in h.verdict
    # one measurement each: no interval, and the headline says so in its first sentence
    assert h.verdict.startswith("The best configuration measured 5.00x the strict fp32 "
                                "baseline, but too few times for a 95% interval (1 and 1 "
                                "measurements;")
    assert "no speedup is claimed at this n." in h.verdict
    assert h.basis.endswith(": too few measurements to tell")  # the card says so too
    h = headline(load_run(write_run(tmp_path / "run2", [recs[0], recs[2]], name="t")))
    assert h.tf32_speedup is None and "fp32+TF32" not in h.verdict


def test_the_mfu_of_a_tf32_trial_is_over_the_tf32_peak():
    from training_harness.measure.peaks import autocast_dtype_name

    assert autocast_dtype_name({"tf32": {}}) == "tf32"
    assert autocast_dtype_name({}) == "fp32"  # strict fp32
    assert autocast_dtype_name({"tf32": {}, "amp": {"dtype": "bf16"}}) == "bf16"
