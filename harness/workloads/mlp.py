"""An MLP on synthetic data: the smallest workload, mostly matrix multiplies.

    input Linear(in_features, hidden) + GELU
    `layers` blocks of Linear(hidden, hidden) + GELU    (model.blocks)
    head Linear(hidden, out_features)

The data come from a fixed random "teacher", so there is something to learn:
for "classification" the label is the argmax of a linear map of the input, for
"regression" the target is that map itself. Batch `index` is drawn on the CPU
from a generator seeded with `index`, then moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.config import bounded, from_table
from harness.core.errors import HarnessError
from harness.workloads.base import Workload

_TEACHER_SEED = 0x7EAC


@dataclass
class MLPConfig:
    in_features: int = bounded(256, 1, 2**24)
    hidden: int = bounded(1024, 1, 2**20)
    layers: int = bounded(4, 1, 4096)
    out_features: int = bounded(10, 1, 2**24)
    task: Literal["classification", "regression"] = "classification"

    def validate(self, where: str) -> None:
        for name in ("in_features", "hidden", "layers", "out_features"):
            if getattr(self, name) < 1:
                raise HarnessError(f"{where}.{name}: must be 1 or more, got {getattr(self, name)}")


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(cfg.in_features, cfg.hidden), nn.GELU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU()) for _ in range(cfg.layers)
        )
        self.head = nn.Linear(cfg.hidden, cfg.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class MLPWorkload(Workload):
    name = "mlp"

    def __init__(self, config: MLPConfig | None = None) -> None:
        self.config = config or MLPConfig()
        self.config.validate("[workload]")

    def build_model(self) -> nn.Module:
        return MLP(self.config)

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        c = self.config
        target_dtype = torch.int64 if c.task == "classification" else torch.float32
        target_shape = (batch_size,) if c.task == "classification" else (batch_size, c.out_features)
        if torch.device(device).type == "meta":  # sizes only: nothing to draw
            return (
                torch.empty(batch_size, c.in_features, device="meta"),
                torch.empty(target_shape, dtype=target_dtype, device="meta"),
            )
        g = torch.Generator(device="cpu").manual_seed(index)
        x = torch.randn(batch_size, c.in_features, generator=g, device="cpu")
        t = torch.Generator(device="cpu").manual_seed(_TEACHER_SEED)
        teacher = torch.randn(c.in_features, c.out_features, generator=t, device="cpu")
        y = x @ teacher / c.in_features**0.5
        if c.task == "classification":
            y = y.argmax(dim=1)
        return x.to(device), y.to(device)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        out = model(x)
        if self.config.task == "classification":
            return F.cross_entropy(out, y)
        return F.mse_loss(out, y)


def build_mlp(**args: Any) -> Workload:
    """The "mlp" workload from its [workload] arguments (see MLPConfig)."""
    return MLPWorkload(from_table(MLPConfig, args, "[workload]"))
