"""The estimator against what torch saves on this CPU: the transformer terms, the
traced path (a classifier head, an MLP, LayerNorm under CUDA autocast, checkpointing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.estimator.measure import saved_bytes
from tests.estimator.models import CPU, CUDA, MLP, TinyClassifier, TinyGPTWorkload, gpt_plan
from training_harness.core.plan import Plan
from training_harness.estimator import estimate


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("amp", [False, True])
def test_transformer_terms_match_what_torch_saves_on_cpu(attention, dropout, amp):
    w = TinyGPTWorkload(layers=2, dropout=dropout, attention=attention)
    plan = gpt_plan(attention, micro_batch=3, **({"amp": {}} if amp else {}))
    e = estimate(plan, w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(3, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    # Left out by the formula: one s x s bool causal mask per block (explicit attention).
    assert e.memory["activations"] == pytest.approx(measured["blocks"], rel=0.01)


@pytest.mark.parametrize("amp", [False, True])
def test_a_classifier_head_is_traced_not_taken_for_a_language_model(amp):
    w = TinyClassifier(attention="sdpa")
    e = estimate(gpt_plan("sdpa", micro_batch=3, **({"amp": {}} if amp else {})), w, CPU)
    # No 12·b·s·V loss: the head's traced working set, at its largest x[:, 0]'s
    # backward, the first token's gradient (b·h) spread into a zero one of b·s·h, fp32.
    s, h = w.shape.seq_len, w.shape.hidden
    assert e.memory["logits"] == 4 * 3 * (s + 1) * h
    assert "qkv_output" in e.block_terms  # the model's SDPA core, seen through the swap
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(3, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    assert e.memory["activations"] == pytest.approx(measured["blocks"], rel=0.01)
    assert e.memory["other_activations"] == measured["outside"]


def test_traced_mlp_matches_a_hand_count():
    w, b = MLP(), 5
    e = estimate(Plan(workload="mlp", micro_batch_size=b), w, CPU)
    # fp32: the input (for FC1's weight gradient), GELU's input, FC2's input (GELU's
    # output), MSE's input and target. FC1 keeps no weight: its input needs no gradient.
    assert e.memory["activations"] == 4 * b * (w.d_in + 2 * w.hidden + 2 * w.d_out)
    amp = estimate(Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}}), w, CPU)
    # bf16 input copy, GELU input and output; MSE runs in fp32 (its input cast up).
    assert amp.memory["activations"] == 2 * b * (w.d_in + 2 * w.hidden) + 4 * b * 2 * w.d_out
    assert amp.memory["autocast_weight_copies"] == 2 * w.hidden * w.d_out  # FC2's weight


@pytest.mark.parametrize("amp", [False, True])
def test_traced_mlp_within_10_percent_of_a_real_cpu_forward(amp):
    w, b = MLP(d_in=64, hidden=256, d_out=16), 32
    plan = Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}} if amp else {})
    e = estimate(plan, w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(b, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    assert e.memory["activations"] == pytest.approx(measured["outside"], rel=0.10)
    assert e.memory["autocast_weight_copies"] == pytest.approx(measured["copies"], rel=0.10)


def test_traced_layernorm_is_fp32_under_cuda_autocast():
    class Normed(MLP):
        def build_model(self) -> nn.Module:
            return nn.Sequential(
                nn.Linear(self.d_in, self.hidden), nn.LayerNorm(self.hidden),
                nn.Linear(self.hidden, self.d_out),
            )

    w, b = Normed(), 5
    plan = Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}})
    cpu, cuda = estimate(plan, w, CPU), estimate(plan, w, CUDA)
    # CUDA autocast runs LayerNorm in fp32: its input (and mean, rstd) take 4 bytes, not 2.
    assert cuda.memory["activations"] - cpu.memory["activations"] == 2 * b * w.hidden + 2 * b * 2


def test_traced_checkpointing_keeps_block_inputs():
    class Deep(MLP):
        def build_model(self) -> nn.Module:
            model = nn.Module()
            model.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU()) for _ in range(3)
            )
            model.inp, model.out = nn.Linear(self.d_in, self.hidden), nn.Linear(self.hidden, 10)

            def forward(x: torch.Tensor) -> torch.Tensor:
                x = model.inp(x)
                for block in model.blocks:
                    x = block(x)
                return model.out(x)

            model.forward = forward
            return model

    w, b = Deep(), 4
    full = estimate(Plan(workload="mlp", micro_batch_size=b), w, CPU)
    ckpt = estimate(Plan(workload="mlp", micro_batch_size=b, strategies={"checkpoint": {}}), w, CPU)
    # A block saves its input (for the weight gradient) and GELU's input: 2·b·hidden fp32.
    assert full.memory["activations"] == 3 * 2 * 4 * b * w.hidden
    assert ckpt.memory["activations"] == 3 * 4 * b * w.hidden
    assert ckpt.memory["recompute"] == 4 * b * w.hidden  # GELU's input, rebuilt
    assert ckpt.flops_per_step == pytest.approx(full.flops_per_step + 3 * 2 * w.hidden**2 * b)
