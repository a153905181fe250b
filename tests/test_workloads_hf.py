"""hf:llama, hf:gpt2 and hf:bert with each single-process technique, against the same
model's fp32 run (tests/workloads/tiny_hf.py: 2 layers, width 32, dropout off).

Tolerances (absolute, on the loss after each of 5 AdamW steps at lr 1e-2, loss ≈ 4),
those of tests/test_strategies.py:
  - exact-math techniques (checkpoint, accumulation, SDPA, foreach / fused AdamW): 1e-4
    (summation order only; observed ≤ 2.7e-5, Llama's SDPA)
  - bf16 autocast: 2e-2 (observed ≤ 6.2e-3, Llama)
  - LAMB: against fp32 training with strategies.lamb.Lamb built by hand, 1e-6
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.tiny import train
from tests.workloads.tiny_hf import TINY_HF, needs_transformers, tiny_hf
from training_harness.strategies.compose import compose
from training_harness.strategies.lamb import Lamb
from training_harness.workloads.blocks import find_blocks

EXACT = 1e-4
BF16 = 2e-2
MODELS = list(TINY_HF)

pytestmark = pytest.mark.usefixtures("transformers_here")


@pytest.fixture(scope="module")
def transformers_here():
    needs_transformers()


@functools.cache
def baseline(model_type: str) -> list[float]:
    return train({}, workload=tiny_hf(model_type))


def assert_close(losses, reference, tol):
    diffs = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    assert max(diffs) <= tol, f"losses differ by up to {max(diffs):.2e} > {tol:.0e}: {diffs}"


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_fp32_run_learns(model_type):
    # (BERT's masked LM sees 2 labels a sequence: 12 steps show noise, not learning.)
    losses = train({}, workload=tiny_hf(model_type), steps=12, lr=2e-2)
    assert losses[-1] < losses[0] - 0.1, losses


CASES = [
    ("checkpoint", {"checkpoint": {}}, 8, EXACT),
    ("checkpoint-every-2", {"checkpoint": {"every": 2}}, 8, EXACT),
    ("accumulation", {"accumulation": {}}, 2, EXACT),
    ("sdpa-foreach", {"fused": {"attention": "sdpa", "optimizer": "foreach"}}, 8, EXACT),
    ("eager-fused-adamw", {"fused": {"attention": "explicit", "optimizer": "fused"}}, 8, EXACT),
    ("amp-bf16", {"amp": {"dtype": "bf16"}}, 8, BF16),
]


@pytest.mark.parametrize("model_type", MODELS)
@pytest.mark.parametrize(("case", "plan", "micro", "tol"), CASES, ids=[c[0] for c in CASES])
def test_technique_matches_the_fp32_run(model_type, case, plan, micro, tol):
    assert_close(train(plan, micro=micro, workload=tiny_hf(model_type)), baseline(model_type), tol)


def lamb_by_hand(workload, steps=5, lr=1e-2) -> list[float]:
    torch.manual_seed(0)
    model = workload.build_model()
    opt = Lamb(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for s in range(steps):
        loss = workload.loss(model, workload.batch(8, s, "cpu"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("model_type", MODELS)
def test_lamb_matches_its_fp32_baseline(model_type):
    workload = tiny_hf(model_type)
    assert_close(train({"lamb": {}}, workload=workload), lamb_by_hand(workload), 1e-6)


def test_all_single_device_techniques_together_on_llama():
    together = {"amp": {"dtype": "bf16"}, "checkpoint": {}, "accumulation": {},
                "fused": {"attention": "sdpa", "optimizer": "fused"}, "lamb": {}}
    workload = tiny_hf("llama")
    assert_close(train(together, micro=2, workload=workload), lamb_by_hand(workload), BF16)


@pytest.mark.parametrize("model_type", MODELS)
def test_fused_switches_the_attention_implementation(model_type):
    workload = tiny_hf(model_type)
    assert workload.build_model().config._attn_implementation == "eager"
    setup = compose(workload.build_model(), {"fused": {"attention": "sdpa"}}, "cpu")
    assert setup.model.config._attn_implementation == "sdpa"
    assert "transformers attn_implementation -> sdpa" in setup.notes[0]


def test_checkpoint_wraps_each_decoder_layer_and_says_which():
    setup = compose(tiny_hf("llama").build_model(), {"checkpoint": {}}, "cpu")
    layers = setup.model.model.layers
    assert all(type(m).__name__ == "CheckpointWrapper" for m in layers)
    assert setup.notes == ["checkpoint (full): 2 of 2 x LlamaDecoderLayer in model.layers"]
    assert len(find_blocks(setup.model)) == 2  # seen through the wrappers


def test_amp_bf16_really_computes_in_bf16():
    workload = tiny_hf("llama")
    setup = compose(workload.build_model(), {"amp": {"dtype": "bf16"}}, "cpu")
    seen = []
    setup.model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, i, o: seen.append(o.dtype))
    setup.step([workload.batch(2, 0, "cpu")], workload.loss)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in setup.model.parameters())


@pytest.mark.slow
def test_compile_per_decoder_layer_matches_the_fp32_run():
    # torch.compile on the CPU takes tens of seconds: one model only.
    plan = {"fused": {"compile": True, "attention": "explicit"}}
    assert_close(train(plan, workload=tiny_hf("llama")), baseline("llama"), EXACT)
