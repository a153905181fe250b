"""The model's sizes, read from the model built on the meta device.

Under [strategies.lora] the adapters are put into that model first, as the strategy
puts them in at its module-swap phase (strategies.lora.inject): the adapters are
parameters like the others, and only they are trainable, so gradients and optimizer
state count them alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from training_harness.workloads.base import Workload
from training_harness.workloads.blocks import Blocks, block_of, find_blocks
from training_harness.workloads.meta import on_meta


@dataclass(frozen=True)
class Param:
    """One unique parameter: where it sits and its size (as one rank holds it, once
    split by `training_harness.estimator.placement`)."""

    name: str  # its first qualified name
    shape: tuple[int, ...]
    width: int  # bytes per element
    trainable: bool
    block: int | None  # its index in the blocks (training_harness.workloads.blocks); None outside
    # Outside the blocks, before them in module order (a pipeline's first stage
    # holds those, the last stage the ones after).
    first: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.numel * self.width


@dataclass(frozen=True)
class ModelFacts:
    """Sizes read from the model built on the meta device."""

    parameters: int  # unique parameters (tied weights once)
    parameter_bytes: int
    buffer_bytes: int
    block_parameters: int | None  # parameters of blocks[0], when the model has blocks
    blocks: int | None
    # "explicit" / "sdpa": the kind of training_harness.workloads.attention core the model
    # uses (the fused strategy can swap those); None: no such core.
    attention_cores: str | None
    params: tuple[Param, ...] = ()  # every unique parameter, in the model's order

    @classmethod
    def of(cls, workload: Workload, lora: Any = None) -> ModelFacts:
        """`lora`: the plan's LoRA settings (strategies.lora.LoraSettings), if any."""
        from training_harness.workloads.attention import ATTENTION

        with on_meta():  # sizes only: the initialisers skipped
            model = workload.build_model()
            if lora is not None:
                from training_harness.strategies.lora import inject

                inject(model, lora)
        params = list(model.parameters())  # unique by identity: tied weights once
        buffers = {id(b): b for b in model.buffers()}.values()
        blocks = find_blocks(model)  # `model.blocks`, or the repeated layers found
        has_blocks = blocks is not None
        cores = [
            kind for m in model.modules() for kind, cls in ATTENTION.items() if type(m) is cls
        ]
        return cls(
            parameters=sum(p.numel() for p in params),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
            block_parameters=(
                sum(p.numel() for p in blocks[0].parameters()) if has_blocks else None
            ),
            blocks=len(blocks) if has_blocks else None,
            attention_cores=cores[0] if cores else None,
            params=tuple(_params(model, blocks)),
        )


def _params(model: nn.Module, blocks: Blocks | None) -> list[Param]:
    """Each unique parameter, with its block or side of the blocks: "first" when it comes
    before the first block in the model's order (or sits on the model itself)."""
    named = list(model.named_parameters())  # unique: tied weights under their first name
    index = [block_of(blocks, name) for name, _ in named]
    start = next((i for i, b in enumerate(index) if b is not None), len(named))
    return [
        Param(name=name, shape=tuple(p.shape), width=p.element_size(), trainable=p.requires_grad,
              block=block, first=block is None and (i < start or "." not in name))
        for i, ((name, p), block) in enumerate(zip(named, index, strict=True))
    ]
