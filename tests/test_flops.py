"""FLOPs of a step, pinned against the PaLM formula worked by hand for GPT-2 small.

PaLM (Chowdhery et al. 2022, appendix B): 6N + 12·L·H·Q·T FLOPs per token for
forward and backward, N the parameters that take part in a matmul. Every embedding
lookup is counted out (a lookup is no matmul); a tied token embedding is the LM
head's matrix and counts once, as the head.

GPT-2 small: L = 12 blocks, H = 768, 12 heads, T = 1024 tokens, V = 50257.
Per block, with biases: QKV 3H² + 3H, projection H² + H, MLP 4H² + 4H and 4H² + H,
two LayerNorms 2H each: 12H² + 13H = 7,087,872. Twelve blocks: 85,054,464.
Final LayerNorm 2H = 1,536. Head V·H = 38,597,376 (no bias).
N = 123,653,376, tied or not (untied, the token embedding is a lookup).
6N = 741,920,256; attention 12·12·768·1024 = 113,246,208; per token 855,166,464;
per sample (x 1024 tokens) 875,690,459,136.
"""

from __future__ import annotations

import pytest

from training_harness.workloads import load_workload

GPT2_SMALL = dict(layers=12, heads=12, hidden=768, seq_len=1024, vocab=50257)
PER_SAMPLE = 875_690_459_136


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_gpt2_small_flops_match_the_palm_formula_by_hand(tied):
    workload = load_workload("gpt", {**GPT2_SMALL, "tie_weights": tied})
    assert workload.flops_per_sample() == PER_SAMPLE


def test_untied_differs_from_counting_the_lookup_by_six_vh_per_token():
    """The defect this pins: an untied token embedding counted as a matmul adds 6·V·H
    per token, about a quarter more for these shapes."""
    counted_lookup = PER_SAMPLE + 6 * 50257 * 768 * 1024
    assert counted_lookup / PER_SAMPLE == pytest.approx(1.2708, abs=1e-4)
    untied = load_workload("gpt", {**GPT2_SMALL, "tie_weights": False})
    assert untied.flops_per_sample() != counted_lookup


def test_mfu_arithmetic_by_hand():
    """GPT-2 small, a global batch of 8 over 2 GPUs, 20 steps in a 10 s window, against
    an H100's bf16 datasheet peak (989.4 TFLOP/s) and a measured 700 TFLOP/s:
    FLOPs per step 8 x 875,690,459,136 = 7,005,523,673,088; a step 0.5 s;
    per device 7,005,523,673,088 / 0.5 / 2 = 7.005523673088 TFLOP/s;
    MFU 7.005523673088 / 989.4 = 0.708058%, against the measured peak 1.000789%."""
    from training_harness.measure.trial_loop import rate_figures

    got = rate_figures(PER_SAMPLE, batch=8, steps=20, window_s=10.0, world=2,
                       peak_flops=989.4e12, measured_peak_flops=700e12)
    assert got["flops_per_step"] == 7_005_523_673_088
    assert got["samples_per_s"] == 16.0
    assert got["tflops_per_device"] == pytest.approx(7.005523673088, rel=1e-12)
    assert got["mfu"] == pytest.approx(0.0070805777977, rel=1e-9)
    assert got["mfu_measured_peak"] == pytest.approx(0.0100078909615, rel=1e-9)


def test_flops_are_counted_once_per_workload_in_a_process(monkeypatch):
    """The tuner's helper prepares every trial: the count (seconds when traced) is made
    once per workload and arguments, whatever the strategies or micro-batch."""
    from training_harness.core.plan import Plan
    from training_harness.measure import prepare as prepare_module
    from training_harness.workloads.gpt import GPTWorkload

    calls = []
    real = GPTWorkload.flops_per_sample
    monkeypatch.setattr(GPTWorkload, "flops_per_sample",
                        lambda self: calls.append(1) or real(self))
    monkeypatch.setattr(prepare_module, "_FLOPS", {})
    small = {"name": "gpt", "layers": 1, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}
    for micro, strategies_ in ((2, {}), (4, {"checkpoint": {}}), (2, {"amp": {"dtype": "bf16"}})):
        plan = Plan.from_dict({"device": "cpu", "micro_batch_size": micro, "workload": small,
                               "strategies": strategies_}, where="plan")
        prepare_module.prepare(plan, peaks={"fp32": PEAK, "bf16": PEAK})
    assert len(calls) == 1
    plan = Plan.from_dict({"device": "cpu", "workload": {**small, "layers": 2}}, where="plan")
    prepare_module.prepare(plan, peaks={"fp32": PEAK})
    assert len(calls) == 2  # other arguments, another count


PEAK = {"dtype": "fp32", "datasheet": None, "measured": {"flops": 1e11, "source": "measured: x"},
        "used": "measured", "flops": 1e11, "source": "measured: x", "reason": "test"}
