"""What a workload is: a model, a batch source and a loss, with its size in FLOPs.

This is the interface a user implements for `--workload package.module:function`:
the function takes the workload's arguments as keywords and returns a Workload.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

# Synthetic held-out batches: indices no training run reaches (a step's index is its batch's).
HELD_OUT_INDEX = 10**9


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

    Subclasses implement the three abstract methods; `Workload.from_callables` (or the
    `@workload` decorator) makes one from plain functions instead. `shape`
    (transformers) and `tokens_per_sample` (language models) are optional. Activation
    checkpointing, per-block compile and FSDP act on the model's repeated layers:
    an `nn.ModuleList` named `blocks` if it has one, else the ones
    `training_harness.workloads.blocks.find_blocks` finds.
    """

    name: str = "workload"
    tokens_per_sample: int | None = None
    shape: TransformerShape | None = None
    # "synthetic", or the real data its batches come from (training_harness.workloads.data): the
    # trial loop then streams them through a DataLoader and measures its wait
    data: str = "synthetic"

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model on the current default device (may be meta)."""

    @abstractmethod
    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        """Batch number `index` (any non-negative int; a seed's run to a target loss starts
        at seed x 1,000,000): the same for the same index, whatever the process."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of `model` on `batch`."""

    def eval_batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        """Held-out batch number `index`, for the validation loss. Seeded synthetic data
        draws it far beyond any training step's index; real data overrides this."""
        return self.batch(batch_size, HELD_OUT_INDEX + index, device)

    def data_info(self) -> dict[str, Any]:
        """What the batches are, for the record."""
        return {"source": self.data}

    @staticmethod
    def from_callables(
        build_model: Callable[[], nn.Module],
        make_batch: Callable[[int, int], Any],
        loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        *,
        name: str = "custom",
        tokens_per_sample: int | None = None,
        flops_per_sample: float | None = None,
    ) -> Workload:
        """A workload from plain functions, no subclass.

        `build_model()` returns a fresh nn.Module; `make_batch(batch_size, index)` returns
        batch `index` (tensors, or tuples / dicts of them) on the CPU, the same for the same
        index (seed a generator with it); the harness moves it. `loss_fn(model, batch)`
        returns the scalar loss; without it the model's own output is the loss
        (`model(*batch)` for a tuple, `model(**batch)` for a dict, else `model(batch)`).
        """
        return CallableWorkload(build_model, make_batch, loss_fn, name, tokens_per_sample,
                                flops_per_sample)

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


def _model_output_is_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(**batch) if isinstance(batch, dict) else model(batch)


class CallableWorkload(Workload):
    """`Workload.from_callables`: the three methods delegate to the user's functions."""

    def __init__(self, build_model, make_batch, loss_fn, name, tokens_per_sample, flops):
        self._build, self._batch = build_model, make_batch
        self._loss = loss_fn or _model_output_is_loss
        self.name, self.tokens_per_sample, self._flops = name, tokens_per_sample, flops

    def build_model(self) -> nn.Module:
        return self._build()

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        made = self._batch(batch_size, index)
        return tree_map(lambda t: t.to(device) if torch.is_tensor(t) else t, made)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return self._loss(model, batch)

    def flops_per_sample(self) -> float:
        return super().flops_per_sample() if self._flops is None else float(self._flops)


def workload(make_batch: Callable[[int, int], Any],
             loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
             **options: Any) -> Callable[[Callable[..., nn.Module]], Callable[..., Workload]]:
    """Decorate a function that builds a model from the [workload] arguments; it then
    returns a Workload (see `Workload.from_callables` for `make_batch`, `loss` and the
    options `name`, `tokens_per_sample`, `flops_per_sample`)::

        @workload(make_batch=my_batches, loss=my_loss)
        def build(width: int = 64) -> nn.Module:
            return MyModel(width)

    and run it with `--workload mypkg.mod:build --arg width=128`.
    """

    def wrap(build: Callable[..., nn.Module]) -> Callable[..., Workload]:
        @functools.wraps(build)  # keeps the signature: the arguments are checked against it
        def make(**args: Any) -> Workload:
            opts = {"name": build.__name__, **options}
            return Workload.from_callables(lambda: build(**args), make_batch, loss, **opts)

        return make

    return wrap
