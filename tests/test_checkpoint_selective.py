"""Selective (op-level) activation checkpointing against its references on a tiny GPT:
the loss and gradients of no checkpointing (within 1e-6); fewer bytes saved for backward
than no checkpointing; fewer matmuls recomputed in backward than full checkpointing."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.tiny import tiny_gpt
from training_harness.core.plan import Plan
from training_harness.estimator.settings import Settings
from training_harness.strategies import checkpoint, registry
from training_harness.strategies.compose import compose

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
           torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default}
PLANS = {"none": {}, "full": {"checkpoint": {"every": 1}},
         "selective": {"checkpoint": {"every": 1, "policy": "selective"}}}


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in MATMULS
        return func(*args, **(kwargs or {}))


def run(name: str, workload, batch, monkeypatch) -> dict:
    """The bytes kept for backward are what saved-tensor hooks pack plus, under the
    selective policy, the op outputs its caching mode keeps (which no hook sees)."""
    caches = []

    def context():
        fwd, recompute = real_context()
        caches.append(fwd)
        return fwd, recompute

    real_context = checkpoint.selective_context
    monkeypatch.setattr(checkpoint, "selective_context", context)
    torch.manual_seed(0)
    setup = compose(workload.build_model(), PLANS[name], "cpu")
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        loss = workload.loss(setup.model, batch)
    saved += sum(leaf.val.numel() * leaf.val.element_size()
                 for cache in caches for outputs in cache.storage.values()
                 for leaf in tree_leaves(outputs) if isinstance(getattr(leaf, "val", None),
                                                               torch.Tensor))
    counter = CountMatmuls()
    with counter:
        loss.backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
             for n, p in setup.model.named_parameters()}
    return {"loss": loss.item(), "grads": grads, "saved": saved, "backward_matmuls": counter.n,
            "notes": setup.notes}


@pytest.fixture(scope="module")
def runs():
    workload = tiny_gpt(layers=3)
    batch = workload.batch(4, 0, "cpu")
    with pytest.MonkeyPatch.context() as mp:
        return {name: run(name, workload, batch, mp) for name in PLANS}


def test_same_loss_and_gradients_as_no_checkpointing(runs):
    ref, sel = runs["none"], runs["selective"]
    assert abs(sel["loss"] - ref["loss"]) <= 1e-6
    assert sel["grads"].keys() == ref["grads"].keys()
    for name, g in ref["grads"].items():
        assert (sel["grads"][name] - g).abs().max().item() <= 1e-6, name
    assert any("checkpoint (selective): 3 of" in n for n in sel["notes"])


def test_stores_less_than_none_and_recomputes_less_than_full(runs):
    none, full, sel = runs["none"], runs["full"], runs["selective"]
    assert full["saved"] < sel["saved"] < none["saved"], {k: v["saved"] for k, v in runs.items()}
    # full recomputes each block's matmuls in backward; selective kept their outputs
    assert none["backward_matmuls"] == sel["backward_matmuls"] < full["backward_matmuls"], \
        {k: v["backward_matmuls"] for k, v in runs.items()}


def test_policy_is_searchable_and_checked():
    ckpt = registry.get("checkpoint")
    assert set(ckpt.space()["policy"].values) == {"full", "selective"}
    with pytest.raises(Exception, match="policy"):
        ckpt.parse({"policy": "sometimes"})
    # the estimator counts selective as keeping everything (an upper bound)
    plan = Plan(strategies=PLANS["selective"])
    assert Settings.of(plan).checkpoint_every is None
    assert Settings.of(Plan(strategies=PLANS["full"])).checkpoint_every == 1
