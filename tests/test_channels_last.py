"""channels_last: the same training in NHWC. Its claims on the CPU: a convolutional
model's loss and gradients within 1e-5 of the contiguous run; its convolutions' weights
and outputs are channels-last; a model with no convolution is refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.estimator import estimate
from training_harness.measure.batches import split_batch
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload

RESNET = {"widths": [8, 16], "blocks_per_stage": 1, "image_size": 16, "num_classes": 10}
CPU = RuntimeEnv.detect("cpu")


def resnet():
    return load_workload("resnet", RESNET)


def plan(strategies: dict) -> Plan:
    return Plan(workload="resnet", workload_args=RESNET, micro_batch_size=4,
                global_batch_size=4, strategies=strategies, device="cpu")


def train(strategies: dict, steps: int = 5) -> list[float]:
    """Losses of `steps` AdamW steps (lr 1e-2) from the same seed and data."""
    workload, p = resnet(), plan(strategies)
    p.optimizer.lr = 1e-2
    torch.manual_seed(0)
    setup = compose(workload.build_model(), p, "cpu")
    return [setup.step(split_batch(workload.batch(4, s, "cpu"), 1), workload.loss).item()
            for s in range(steps)]


def test_the_loss_is_the_contiguous_runs():
    plain, nhwc = train({}), train({"channels_last": {}})
    assert nhwc == pytest.approx(plain, abs=1e-5)  # observed <= 1e-6
    assert plain[-1] < plain[0]  # it trains


def test_gradients_match_and_the_tensors_are_channels_last():
    workload = resnet()
    grads, outputs = [], []
    for strategies in ({}, {"channels_last": {}}):
        torch.manual_seed(0)
        model = workload.build_model()
        setup = compose(model, plan(strategies), "cpu")
        convs = [m for m in setup.model.modules() if isinstance(m, nn.Conv2d)]
        seen = []
        hooks = [c.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o))
                 for c in convs]
        x, y = workload.batch(4, 0, "cpu")
        workload.loss(setup.model, (x, y)).backward()
        for h in hooks:
            h.remove()
        grads.append([p.grad.clone() for p in setup.model.parameters()])
        outputs.append(seen)
        if strategies:
            assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
            assert all(o.is_contiguous(memory_format=torch.channels_last) for o in seen)
            assert any(not o.is_contiguous() for o in seen)  # not merely both (1x1 maps)
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_a_model_without_convolutions_is_refused_and_the_estimate_says_so():
    gpt = Plan(workload="gpt", workload_args={"layers": 1, "hidden": 32, "heads": 2,
                                              "seq_len": 16, "vocab": 64},
               strategies={"channels_last": {}}, device="cpu")
    (why,) = reasons_against(gpt, CPU)
    assert "'gpt' has none" in why and "\n" not in why
    nhwc = plan({"channels_last": {}})
    assert reasons_against(nhwc, CPU) == []
    got = estimate(nhwc, resnet(), CPU)
    without = estimate(plan({}), resnet(), CPU)
    assert got.peak_memory_bytes == without.peak_memory_bytes
    assert any("channels_last is estimated as the plan without it" in a for a in got.assumptions)
