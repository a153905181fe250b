"""A model built for its sizes (training_harness.workloads.meta.on_meta) is the model a plain
meta build makes, initialisers skipped; outside it, or on a real tensor, they run."""

from __future__ import annotations

import torch
from torch import nn

from training_harness.estimator.facts import ModelFacts
from training_harness.workloads import load_workload
from training_harness.workloads.meta import on_meta


def described(model: nn.Module) -> list[tuple]:
    return [(name, p.shape, p.dtype, p.requires_grad, p.is_meta)
            for name, p in model.named_parameters()] + \
        [(name, b.shape, b.dtype) for name, b in model.named_buffers()]


def test_on_meta_builds_the_same_model_without_its_initialisers():
    workload = load_workload("gpt", {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16,
                                     "vocab": 64})
    with torch.device("meta"):
        plain = workload.build_model()
    with on_meta():
        skipped = workload.build_model()
        cpu = torch.nn.init.normal_(torch.zeros(64, device="cpu"))  # a real one: filled
    assert described(skipped) == described(plain)
    assert skipped.lm_head.weight is skipped.wte.weight  # tied, as built
    assert cpu.abs().sum() > 0
    assert ModelFacts.of(workload).parameters == sum(p.numel() for p in plain.parameters())
    outside = torch.nn.init.normal_(torch.zeros(64))
    assert outside.abs().sum() > 0  # the mode ends with the block
