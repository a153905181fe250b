"""docs/models.md's example: a plain nn.Module trained by the harness, no subclass."""

import torch
from torch import nn

from training_harness.workloads import workload


def make_batch(batch_size: int, index: int):
    g = torch.Generator().manual_seed(index)  # the same index gives the same batch
    x = torch.randn(batch_size, 16, generator=g)
    return x, x.sum(1, keepdim=True)


def mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


@workload(make_batch=make_batch, loss=mse)
def build(width: int = 32, depth: int = 3) -> nn.Module:
    layers = [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]
    return nn.Sequential(nn.Linear(16, width), nn.Sequential(*layers), nn.Linear(width, 1))
