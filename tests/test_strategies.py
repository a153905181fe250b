"""Each strategy against the plain fp32 baseline on a tiny GPT, and its effect.

Tolerances (absolute, on the loss after each of 5 AdamW steps at lr 1e-2, loss ≈ 4):
  - exact-math techniques (checkpoint, accumulation, SDPA, fused AdamW): 1e-4
    (different summation orders in fp32; observed ≤ 1e-6)
  - bf16 autocast: 2e-2 (bf16 keeps 8 mantissa bits; observed ≤ 1.4e-3)
  - LAMB is a different optimizer, so its baseline is fp32 training with
    strategies.lamb.Lamb itself, built by hand.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

from tests.tiny import tiny_gpt, train
from training_harness.core.plan import Plan
from training_harness.measure.batches import split_batch
from training_harness.strategies import registry
from training_harness.strategies.compose import compose
from training_harness.strategies.lamb import Lamb

EXACT = 1e-4
BF16 = 2e-2


@pytest.fixture(scope="module")
def baseline() -> list[float]:
    return train({})


def assert_close(losses, reference, tol):
    diffs = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    assert max(diffs) <= tol, f"losses differ by up to {max(diffs):.2e} > {tol:.0e}: {diffs}"


def test_baseline_learns(baseline):
    assert baseline[-1] < baseline[0] - 0.1


@pytest.mark.parametrize("settings", [{"every": 1}, {"every": 2}])
def test_checkpoint_matches_baseline(baseline, settings):
    assert_close(train({"checkpoint": settings}), baseline, EXACT)


def test_accumulation_matches_baseline(baseline):
    # 4 micro-batches of 2 make the same global batch of 8.
    assert_close(train({"accumulation": {}}, micro=2), baseline, EXACT)


@pytest.mark.parametrize("optimizer", ["default", "foreach", "fused"])
def test_fused_matches_baseline(baseline, optimizer):
    assert_close(train({"fused": {"attention": "sdpa", "optimizer": optimizer}}), baseline, EXACT)


def test_amp_bf16_matches_baseline_loosely(baseline):
    assert_close(train({"amp": {"dtype": "bf16"}}), baseline, BF16)


def test_amp_bf16_really_computes_in_bf16():
    workload = tiny_gpt()
    setup = compose(workload.build_model(), {"amp": {"dtype": "bf16"}}, "cpu")
    seen = []
    setup.model.blocks[0].qkv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    setup.step([workload.batch(2, 0, "cpu")], workload.loss)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in setup.model.parameters())  # master weights


def lamb_by_hand(steps=5, lr=1e-2) -> list[float]:
    workload = tiny_gpt()
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


def test_lamb_matches_its_fp32_baseline():
    assert_close(train({"lamb": {}}), lamb_by_hand(), 1e-6)


def test_lamb_learns():
    losses = train({"lamb": {}}, steps=30, lr=2e-2)
    assert losses[-1] < losses[0] - 0.1, losses


def test_all_single_device_strategies_together():
    together = {
        "amp": {"dtype": "bf16"},
        "checkpoint": {"every": 1},
        "accumulation": {},
        "fused": {"attention": "sdpa", "optimizer": "fused"},
        "lamb": {},
    }
    assert_close(train(together, micro=2), lamb_by_hand(), BF16)


def saved_bytes(model, workload, batch) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        workload.loss(model, batch)
    return total


def test_checkpoint_stores_fewer_bytes_for_backward():
    workload = tiny_gpt(layers=4)
    batch = workload.batch(8, 0, "cpu")
    counts = {}
    for every in (None, 2, 1):
        torch.manual_seed(0)
        model = workload.build_model()
        plan = {} if every is None else {"checkpoint": {"every": every}}
        setup = compose(model, plan, "cpu")
        counts[every] = saved_bytes(setup.model, workload, batch)
    assert counts[1] < counts[2] < counts[None], counts
    # Checkpointing all 4 blocks keeps at least half the bytes out of memory here.
    assert counts[1] < 0.5 * counts[None], counts


class GradCapture(torch.optim.Optimizer):
    """An 'optimizer' that records the gradients it is given instead of stepping."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() for g in self.param_groups for p in g["params"]])


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_accumulation_gives_the_big_batch_gradient(micro):
    workload = tiny_gpt()
    batch = workload.batch(8, 0, "cpu")
    torch.manual_seed(0)
    model = workload.build_model()
    full = workload.loss(model, batch)
    full.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    plan = Plan(micro_batch_size=micro, global_batch_size=8, strategies={"accumulation": {}})
    setup = compose(model, plan, "cpu")
    setup.optimizer = GradCapture(model.parameters())
    setup.step(split_batch(batch, 8 // micro), workload.loss)
    for got, want in zip(setup.optimizer.grads[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_accumulation_step_count_follows_the_plan():
    plan = Plan(micro_batch_size=2, global_batch_size=16, strategies={"accumulation": {}})
    setup = compose(tiny_gpt().build_model(), plan, "cpu")
    assert setup.accumulation_steps == 8


def test_fused_swaps_attention_and_optimizer():
    workload = tiny_gpt()
    setup = compose(workload.build_model(), {"fused": {"optimizer": "foreach"}}, "cpu")
    kinds = {type(b.attention).__name__ for b in setup.model.blocks}
    assert kinds == {"SdpaAttention"}
    assert setup.optimizer.defaults["foreach"] is True


@pytest.mark.slow
def test_fused_compile_matches_baseline(baseline):
    # torch.compile on the CPU takes tens of seconds: the one compile test.
    assert_close(train({"fused": {"compile": True, "attention": "sdpa"}}), baseline, EXACT)


def test_registry_refuses_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("amp"))


def test_composition_follows_phase_order():
    order = [min(s.phases) for s in registry.all_strategies()]
    assert order == sorted(order)
