"""sparse_attention: causal sliding-window (and global-token) attention. Claims on the
CPU, on a tiny GPT and a tiny hf: Mistral, loss within 1e-5 and gradients within 1e-5
(rtol 1e-4) of the references: a window of seq_len is full causal attention; a window
(and global tokens) is explicit attention with the same band mask, computed densely in
this file; on hf:mistral it is transformers' own eager sliding window. Its effect: the
block mask skips blocks (fewer than the causal mask's), and the FLOPs counted per step are
lower by the share of blocks it skips (counted here from the dense mask, block by
block). Refusals, the maths key and the estimate."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.core.target import maths_key
from training_harness.estimator import estimate
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload
from training_harness.workloads.attention import causal_block_mask
from training_harness.workloads.sparse_attention import Pattern, SparseAttention, swap_in

GPT = {"layers": 2, "heads": 2, "hidden": 32, "seq_len": 64, "vocab": 64}
MISTRAL = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64,
           "seq_len": 32}
CPU = RuntimeEnv.detect("cpu")


class BandAttention(nn.Module):
    """The reference: softmax(QKᵀ/√d) V over the pairs j <= i with i - j < window or
    j < sinks, the scores materialised."""

    def __init__(self, window: int, sinks: int = 0):
        super().__init__()
        self.window, self.sinks, self.dropout, self.causal = window, sinks, 0.0, True

    def forward(self, q, k, v):
        t = q.size(-2)
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        allowed = (j <= i) & ((i - j < self.window) | (j < self.sinks))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def plan(workload: str = "gpt", args: dict | None = None, **strategies) -> Plan:
    return Plan(workload=workload, workload_args=args or GPT, micro_batch_size=4,
                global_batch_size=4, strategies=strategies, device="cpu")


def loss_and_grads(workload, model):
    loss = workload.loss(model, workload.batch(4, 0, "cpu"))
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def gpt_with(core: nn.Module | None, sparse: dict | None = None):
    """(loss, gradients) of the tiny GPT, its cores replaced by `core`, or composed with
    sparse_attention's settings."""
    workload = load_workload("gpt", GPT)
    torch.manual_seed(0)
    model = workload.build_model()
    if core is not None:
        for block in model.blocks:
            block.attention = core
    else:
        model = compose(model, plan(sparse_attention=sparse), "cpu").model
    return loss_and_grads(workload, model)


def assert_same(got, want):
    assert got[0] == pytest.approx(want[0], abs=1e-5)  # observed <= 1e-6
    for name, g in want[1].items():
        torch.testing.assert_close(got[1][name], g, atol=1e-5, rtol=1e-4)


def test_a_window_of_seq_len_is_full_causal_attention():
    full = gpt_with(BandAttention(window=GPT["seq_len"]))
    assert_same(gpt_with(SparseAttention(Pattern(window=GPT["seq_len"], block=16))), full)


@pytest.mark.parametrize(("window", "sinks"), [(8, 0), (16, 4), (5, 3)])
def test_a_window_is_the_band_masked_explicit_attention(window, sinks):
    want = gpt_with(BandAttention(window, sinks))
    got = gpt_with(None, {"window": window, "global_tokens": sinks, "block": 16})
    assert_same(got, want)
    assert got[0] != pytest.approx(gpt_with(BandAttention(GPT["seq_len"]))[0], abs=1e-4)


def test_window_fraction_sets_the_window():
    model = compose(load_workload("gpt", GPT).build_model(),
                    plan(sparse_attention={"window_fraction": 0.25}), "cpu").model
    cores = [m for m in model.modules() if isinstance(m, SparseAttention)]
    assert len(cores) == GPT["layers"] and cores[0].pattern.window == 16


def test_on_hf_it_is_transformers_own_sliding_window():
    pytest.importorskip("transformers")
    workload = load_workload("hf:mistral", {**MISTRAL, "sliding_window": 8})
    torch.manual_seed(0)
    want = loss_and_grads(workload, workload.build_model())  # eager, its own window
    dense = load_workload("hf:mistral", {**MISTRAL, "sliding_window": None})
    torch.manual_seed(0)
    setup = compose(dense.build_model(), plan("hf:mistral", {**MISTRAL, "sliding_window": None},
                                              sparse_attention={"window": 8}), "cpu")
    assert setup.model.config._attn_implementation.startswith("harness_sparse")
    assert_same(loss_and_grads(dense, setup.model), want)


def blocks_in_pattern(pattern: Pattern, seq: int) -> int:
    """The (query, key) blocks holding at least one allowed pair, from the dense mask."""
    mask = pattern.dense_mask(seq, "cpu")[0, 0]
    n, b = -(-seq // pattern.block), pattern.block
    return sum(bool(mask[i * b:(i + 1) * b, j * b:(j + 1) * b].any())
               for i in range(n) for j in range(n))


def test_the_block_mask_skips_blocks():
    seq, pattern = 1024, Pattern(window=128, block=128)
    sparse = pattern.block_mask(seq, "cpu").kv_num_blocks.sum()
    causal = causal_block_mask(seq, "cpu")
    assert int(sparse) == blocks_in_pattern(pattern, seq) == 15  # 8 diagonal + 7 below
    assert int(causal.kv_num_blocks.sum() + causal.full_kv_num_blocks.sum()) == 36
    assert pattern.computed_fraction(seq) == pytest.approx(15 / 64)


def test_the_flops_per_step_count_the_blocks_computed():
    workload = load_workload("gpt", GPT)
    settings = {"window": 16, "global_tokens": 4, "block": 16}
    setup = compose(workload.build_model(), plan(sparse_attention=settings), "cpu")
    flops, tokens = setup.work_at(0)
    pattern = Pattern(16, 4, 16)
    share = blocks_in_pattern(pattern, GPT["seq_len"]) / (GPT["seq_len"] // 16) ** 2
    attention = 12 * GPT["layers"] * GPT["hidden"] * GPT["seq_len"] ** 2
    assert share < 1
    assert flops == pytest.approx(workload.flops_per_sample() - attention * (1 - share))
    assert tokens == GPT["seq_len"] and setup.work_at(7) == (flops, tokens)
    predicted = estimate(plan(sparse_attention=settings), workload, CPU)
    assert predicted.flops_per_step == pytest.approx(4 * flops)
    assert "softmax_output" not in predicted.block_terms
    assert any("sparse_attention" in a for a in predicted.assumptions)


@pytest.mark.parametrize(("p", "words"), [
    (plan(sparse_attention={"window": 64}), "full causal attention"),
    (plan(sparse_attention={"window_fraction": 0.01}), "under one token"),
    (plan(args={**GPT, "dropout": 0.1}, sparse_attention={}), "no attention dropout"),
    (plan(sparse_attention={}, curriculum={"start": 16}), "beside curriculum"),
    (plan("hf:bert", {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                      "intermediate_size": 64, "vocab_size": 64, "seq_len": 32},
          sparse_attention={}), "masked LM"),
    (plan("hf:t5", {"num_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2, "d_kv": 16,
                    "vocab_size": 64, "seq_len": 32}, sparse_attention={}), "encoder-decoder"),
    (plan("mlp", {}, sparse_attention={}), "not a language model"),
])
def test_what_it_cannot_apply_to_is_refused_in_one_line(p, words):
    if p.workload.startswith("hf:"):
        pytest.importorskip("transformers")
    reasons = reasons_against(p, CPU)
    assert any(words in r for r in reasons), reasons
    assert all("\n" not in r for r in reasons)


@pytest.mark.parametrize("first", ["fused", "sparse_attention"])
def test_it_wins_over_fused_attention_in_either_order(first):
    tables = {"fused": {"attention": "sdpa"}, "sparse_attention": {"window": 8}}
    order = [first, *(n for n in tables if n != first)]
    model = compose(load_workload("gpt", GPT).build_model(),
                    plan(**{n: tables[n] for n in order}), "cpu").model
    assert sum(isinstance(m, SparseAttention) for m in model.modules()) == GPT["layers"]


def test_swap_in_replaces_every_core():
    model = load_workload("gpt", GPT).build_model()
    assert swap_in(model, Pattern(8)) == GPT["layers"]
    assert swap_in(model, Pattern(4)) == GPT["layers"]  # a sparse core is replaced too


def test_its_settings_are_in_the_maths_key():
    def key(p: Plan) -> str:
        return maths_key(p.to_dict(), 0, "cpu")

    keys = {key(plan(sparse_attention=s)) for s in ({}, {"window": 8}, {"window": 16})}
    assert len(keys) == 3 and key(plan()) not in keys
