"""What a workload is: a model, a batch source and a loss, with its size in FLOPs.

This is the interface a user implements for `--workload package.module:function`:
the function takes the workload's arguments as keywords and returns a Workload.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class TransformerShape:
    """The sizes the memory estimator needs to apply Korthikanti et al. (2022)."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int
    dropout: float = 0.0


class Workload(ABC):
    """A model to train, a seeded batch source and its loss.

    Subclasses implement the three abstract methods. `shape` (transformers) and
    `tokens_per_sample` (language models) are optional. The model should keep its
    repeated layers in an `nn.ModuleList` named `blocks`: activation checkpointing,
    per-block compilation and pipeline splitting work on those.
    """

    name: str = "workload"
    tokens_per_sample: int | None = None
    shape: TransformerShape | None = None

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model on the current default device (may be meta)."""

    @abstractmethod
    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        """Batch number `index`: the same for the same index, whatever the process."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of `model` on `batch`."""

    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample, counted by torch's FLOP counter.

        Counted on the meta device, so nothing is allocated or run. Transformers
        override this with the analytic 6N + 12·L·H·Q·T per token.
        """
        from torch.utils.flop_counter import FlopCounterMode

        n = 2
        with torch.device("meta"):
            model = self.build_model()
        batch = self.batch(n, 0, "meta")  # made on the CPU by contract, then moved
        with FlopCounterMode(display=False) as counter:
            self.loss(model, batch).backward()
        return counter.get_total_flops() / n
