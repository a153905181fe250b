"""The estimator's exact state bytes and its per-term activation formula: against
Korthikanti et al.'s eq. 1, and how each setting changes the terms."""

from __future__ import annotations

import pytest
from torch import nn

from tests.estimator.models import (
    CPU,
    CUDA,
    SHAPE,
    TinyGPTWorkload,
    expected_parameters,
    gpt_plan,
)
from training_harness.estimator import (
    PAPER,
    block_activation_terms,
    blocks_moment,
    estimate,
    korthikanti_bytes,
    widths_for,
)
from training_harness.workloads.base import TransformerShape

# --- parameters, gradients, optimizer state --------------------------------------------


@pytest.mark.parametrize("strategies", [{}, {"amp": {}}, {"lamb": {}}])
def test_state_is_4_4_8_bytes_per_unique_parameter(strategies):
    w = TinyGPTWorkload()
    psi = expected_parameters(w)
    e = estimate(gpt_plan(**strategies), w, CPU)
    assert e.memory["parameters"] == 4 * psi
    assert e.memory["gradients"] == 4 * psi
    assert e.memory["optimizer_state"] == 8 * psi


def test_frozen_parameters_have_no_gradients_or_moments():
    class Frozen(TinyGPTWorkload):
        def build_model(self) -> nn.Module:
            model = super().build_model()
            model.wpe.weight.requires_grad_(False)
            return model

    w = Frozen()
    e = estimate(gpt_plan(), w, CPU)
    frozen = w.shape.seq_len * w.shape.hidden
    assert e.memory["parameters"] == 4 * expected_parameters(w)
    assert e.memory["gradients"] == 4 * (expected_parameters(w) - frozen)


# --- the per-term activation formula -----------------------------------------------------



def test_paper_setting_gives_korthikanti_eq1():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    terms = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=True)
    assert sum(terms.values()) == 34 * s * b * h + 5 * a * s * s * b
    assert sum(terms.values()) == korthikanti_bytes(SHAPE, b)


def test_no_dropout_drops_masks_and_dropout_output():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    terms = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=False)
    assert sum(terms.values()) == 32 * s * b * h + 2 * a * s * s * b


def test_sdpa_drops_the_s_squared_terms():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    fused = block_activation_terms(SHAPE, b, PAPER, attention="fused", dropout=True)
    # Q, K, V and the output as before, no scores: only a fp32 log-sum-exp per row and head.
    assert sum(fused.values()) == 34 * s * b * h + 4 * a * s * b
    longer = TransformerShape(**{**SHAPE.__dict__, "seq_len": 2 * s})
    doubled = block_activation_terms(longer, b, PAPER, attention="fused", dropout=True)
    assert sum(doubled.values()) == 2 * sum(fused.values())  # linear in s


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bf16_halves_the_16_bit_terms(device):
    fp32 = block_activation_terms(SHAPE, 2, widths_for(False, device), dropout=True)
    bf16 = block_activation_terms(SHAPE, 2, widths_for(True, device), dropout=True)
    for term in ("qkv_input", "q_and_k", "v", "proj_input", "fc1_input", "gelu_input", "fc2_input"):
        assert bf16[term] * 2 == fp32[term], term
    # The residual stream stays fp32 under autocast: LayerNorm inputs keep 4 bytes.
    assert bf16["ln1_input"] == fp32["ln1_input"] == 4 * SHAPE.seq_len * 2 * SHAPE.hidden
    if device == "cuda":  # softmax in fp32 and bool dropout masks under CUDA autocast
        assert bf16["softmax_output"] == fp32["softmax_output"]
        assert bf16["residual_dropout_mask"] == fp32["residual_dropout_mask"]


def test_estimate_activations_are_blocks_times_terms():
    w = TinyGPTWorkload(layers=3)
    e = estimate(gpt_plan(), w, CPU)
    assert e.memory["activations"] == 3 * sum(e.block_terms.values())
    s, b, v = w.shape.seq_len, 4, w.shape.vocab
    assert e.memory["logits"] == 12 * b * s * v


def test_checkpointing_every_block_keeps_only_block_inputs():
    w = TinyGPTWorkload(layers=4)
    s, b, h = w.shape.seq_len, 4, w.shape.hidden
    full = estimate(gpt_plan(), w, CPU)
    every1 = estimate(gpt_plan(checkpoint={}), w, CPU)
    every2 = estimate(gpt_plan(checkpoint={"every": 2}), w, CPU)
    per_block = sum(full.block_terms.values())
    assert every1.memory["activations"] == 4 * (4 * s * b * h)  # fp32 residual inputs
    assert every1.memory["recompute"] == per_block - full.block_terms["ln1_input"]
    assert every2.memory["activations"] == 2 * (4 * s * b * h) + 2 * per_block
    assert every1.memory["activations"] < every2.memory["activations"] < full.memory["activations"]
    assert full.memory["recompute"] == 0
    # The recompute adds one forward of each checkpointed block.
    block_fwd = s * (2 * (12 * h * h + 13 * h) + 4 * h * s)
    extra = every1.flops_per_step - full.flops_per_step
    assert extra == pytest.approx(4 * block_fwd * b)


def test_backward_through_an_early_block_meets_the_most_gradients():
    # Three blocks keeping 1 byte each, 10 bytes of parameters each, 5 more outside.
    # Block 0's backward meets every gradient but its predecessors' (none): 1 + 35;
    # block 2's meets 3 bytes of activations + 15.
    assert blocks_moment([1, 1, 1], [10, 10, 10], [], 0, 35, held=0) == 36
    # An early block that keeps much (a ResNet's first stage) meets the gradients of
    # all the later ones, checkpointed or not.
    assert blocks_moment([100, 1, 1], [10, 10, 10], [2], 0, 35, held=0) == 100 + 35
    # A checkpointed block is rebuilt (50 bytes) before its backward.
    assert blocks_moment([1, 1, 1], [10, 10, 10], [2], 50, 35, held=0) == 3 + 50 + 15
    assert blocks_moment([1, 1, 1], [10, 10, 10], [2], 0, 35, held=35) == 3 + 35  # accumulation


def test_sdpa_setting_removes_s_squared_terms_from_the_estimate():
    w = TinyGPTWorkload(seq_len=64)
    explicit = estimate(gpt_plan("explicit"), w, CUDA)
    fused = estimate(gpt_plan("explicit", fused={"attention": "sdpa"}), w, CUDA)
    assert "softmax_output" in explicit.block_terms and "softmax_output" not in fused.block_terms
    assert fused.memory["activations"] < explicit.memory["activations"]
    back = estimate(gpt_plan("sdpa", fused={"attention": "explicit"}), TinyGPTWorkload(), CUDA)
    assert "softmax_output" in back.block_terms  # the swap goes both ways


def test_chunked_cross_entropy_holds_only_the_logits():
    w = TinyGPTWorkload()
    s, v = w.shape.seq_len, w.shape.vocab
    eager = estimate(gpt_plan(amp={}), w, CUDA)
    chunked = estimate(gpt_plan(amp={}, fused={"cross_entropy": "triton"}), w, CUDA)
    assert eager.memory["logits"] == 12 * 4 * s * v
    assert chunked.memory["logits"] == 2 * 4 * s * v  # bf16 logits, gradient written over them


def test_amp_lowers_activations_and_adds_weight_copies():
    w = TinyGPTWorkload()
    fp32 = estimate(gpt_plan(), w, CUDA)
    amp = estimate(gpt_plan(amp={"dtype": "bf16"}), w, CUDA)
    assert amp.memory["activations"] < fp32.memory["activations"]
    assert amp.memory["autocast_weight_copies"] == 2 * expected_parameters(w)
    assert fp32.memory["autocast_weight_copies"] == 0
