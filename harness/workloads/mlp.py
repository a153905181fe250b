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

from training_harness.core.config import bounded, from_table
from training_harness.core.errors import HarnessError
from training_harness.workloads.base import Workload
from training_harness.workloads.data import check_name, images, is_synthetic

_TEACHER_SEED = 0x7EAC


@dataclass
class MLPConfig:
    in_features: int = bounded(256, 1, 2**24)
    hidden: int = bounded(1024, 1, 2**20)
    layers: int = bounded(4, 1, 4096)
    out_features: int = bounded(10, 1, 2**24)
    task: Literal["classification", "regression"] = "classification"
    data: str = "synthetic"  # or "digits" (in_features 64) or an .npz image set, flattened

    def validate(self, where: str) -> None:
        check_name(self.data, "images", where)
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
        self.config = c = config or MLPConfig()
        c.validate("[workload]")
        self.data = c.data
        if not is_synthetic(c.data):
            real = images(c.data)
            pixels = real.train_x[0].numel()
            if c.in_features != pixels or c.task != "classification":
                raise HarnessError(f"[workload]: {real.source} gives {pixels} pixels to classify; "
                                   f"set in_features = {pixels} and task = 'classification'")
            real.check(c.out_features, "[workload] (out_features)")

    def build_model(self) -> nn.Module:
        return MLP(self.config)

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        c = self.config
        if not is_synthetic(c.data) and torch.device(device).type != "meta":
            return self._flat(images(c.data).train_batch(batch_size, index), device)
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

    def eval_batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        if is_synthetic(self.config.data):
            return super().eval_batch(batch_size, index, device)
        return self._flat(images(self.config.data).eval_batch(batch_size, index), device)

    def _flat(self, batch: Any, device: torch.device | str) -> Any:
        x, y = batch
        return x.flatten(1).to(device), y.to(device)

    def data_info(self) -> dict[str, Any]:
        if is_synthetic(self.config.data):
            return super().data_info()
        return images(self.config.data).describe()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        out = model(x)
        if self.config.task == "classification":
            return F.cross_entropy(out, y)
        return F.mse_loss(out, y)


def build_mlp(**args: Any) -> Workload:
    """The "mlp" workload from its [workload] arguments (see MLPConfig)."""
    return MLPWorkload(from_table(MLPConfig, args, "[workload]"))
