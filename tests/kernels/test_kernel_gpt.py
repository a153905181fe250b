"""The tiny GPT with every kernel on trains to the same losses as without.

Kernels on: FusedLayerNorm for every LayerNorm, LinearBiasGELU for each MLP's
up-projection + GELU, ChunkedCrossEntropy (in place) for the criterion and
MultiTensorAdamW for torch.optim.AdamW. Same initial weights, same batches, fp32:
each step's loss within rtol 1e-5 of the plain model's, and the final weights
within rtol 1e-3, atol 5e-5 (the kernels round differently, and Adam's normalised
step turns a tiny gradient difference on a near-zero gradient into a visible one:
on the CPU the largest weight difference is ~5e-6, the step size 3e-3).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from training_harness.kernels.bias_gelu import LinearBiasGELU  # noqa: E402
from training_harness.kernels.cross_entropy import ChunkedCrossEntropy  # noqa: E402
from training_harness.kernels.layernorm import FusedLayerNorm  # noqa: E402
from training_harness.kernels.multi_tensor import MultiTensorAdamW  # noqa: E402
from training_harness.workloads.gpt import GPTConfig, GPTWorkload  # noqa: E402

STEPS = 3


def with_kernels(model: nn.Module) -> nn.Module:
    """Swap the GPT's modules for the fused ones, sharing their parameters."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.LayerNorm:
                setattr(module, name, FusedLayerNorm.from_layernorm(child, impl="triton"))
            elif isinstance(child, nn.CrossEntropyLoss):
                setattr(module, name, ChunkedCrossEntropy.from_loss(child, impl="triton"))
        if hasattr(module, "up") and isinstance(getattr(module, "act", None), nn.GELU):
            module.up = LinearBiasGELU.from_linear(module.up, module.act.approximate, "triton")
            module.act = nn.Identity()
    return model


def _train(workload, model, optimizer, device):
    losses = []
    for i in range(STEPS):
        loss = workload.loss(model, workload.batch(2, i, device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_tiny_gpt_trains_the_same_with_every_kernel(device):
    cfg = GPTConfig(layers=2, heads=2, hidden=32, seq_len=16, vocab=101)
    workload = GPTWorkload(cfg)
    torch.manual_seed(0)
    plain = workload.build_model().to(device)
    fused = with_kernels(copy.deepcopy(plain))
    n_fused = sum(isinstance(m, FusedLayerNorm | LinearBiasGELU | ChunkedCrossEntropy)
                  for m in fused.modules())
    assert n_fused == 2 * 2 + 1 + 2 + 1  # ln1, ln2 per block, ln_f, 2 MLPs, criterion
    assert list(fused.state_dict()) == list(plain.state_dict())

    hp = dict(lr=3e-3, weight_decay=0.1)
    expected = _train(workload, plain, torch.optim.AdamW(plain.parameters(), **hp,
                                                         foreach=False), device)
    got = _train(workload, fused, MultiTensorAdamW(fused.parameters(), **hp, impl="triton"),
                 device)
    assert expected[-1] < expected[0]  # it learns
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=5e-5, msg=lambda m, n=name: f"{n}: {m}")
