"""An example of a user's own workload, run with

    harness bench --workload tests.user_workload:build

The function takes the workload's arguments as keywords and returns a Workload.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.workloads.base import Workload


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        # Repeated layers live in `blocks`, so checkpointing and compilation can wrap them.
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(2)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class SumRegression(Workload):
    """Learn y = sum(x) from 8 random inputs."""

    name = "sum-regression"

    def __init__(self, width: int) -> None:
        self.width = width

    def build_model(self) -> nn.Module:
        return Net(self.width)

    def batch(self, batch_size: int, index: int, device: torch.device | str):
        # Draw on the CPU from a generator seeded with the index, then move: the
        # same batch in every process and on every device.
        g = torch.Generator(device="cpu").manual_seed(index)
        x = torch.randn(batch_size, 8, generator=g, device="cpu")
        return x.to(device), x.sum(dim=1, keepdim=True).to(device)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)


def build(width: int = 16) -> Workload:
    return SumRegression(width)
