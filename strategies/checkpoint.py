"""Activation checkpointing: keep a block's input, recompute its inside in backward.

`policy = "full"` recomputes the whole block in backward; `policy = "selective"` is
op-level (torch's `create_selective_checkpoint_contexts`, as torchtitan's op-level
SAC): inside each checkpointed block the outputs of the matmuls and attention
kernels are saved and only the cheap element-wise ops (norms, activations, adds,
dropout masks) are recomputed, so it stores less than no checkpointing and
recomputes less than full checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register
from training_harness.workloads.blocks import find_blocks


@dataclass
class CheckpointSettings:
    every: int = 1  # checkpoint blocks 0, k, 2k, ...; 1 checkpoints all of them
    # "full": recompute the whole block; "selective": keep matmul/attention outputs,
    # recompute the element-wise ops (op-level selective activation checkpointing)
    policy: Literal["full", "selective"] = "full"

    def validate(self, where: str) -> None:
        if self.every < 1:
            raise HarnessError(f"{where}.every: must be 1 or more (1 = every block)")


class Checkpoint(Strategy):
    name = "checkpoint"
    summary = ("activation checkpointing of every k-th block (trades recompute for memory), "
               "the whole block or op-level selective (matmul outputs kept)")
    phases = (Phase.CHECKPOINT,)
    Settings = CheckpointSettings
    requires = ("a model with repeated layers: `model.blocks`, or found (HF decoder layers, "
                "torchvision stages)")

    def space(self):
        return {"every": Choice((1, 2, 4)), "policy": Choice(("full", "selective"))}

    def apply(self, phase, setup, settings):
        blocks = find_blocks(setup.model)
        if blocks is None:
            raise HarnessError(
                "checkpoint: the model has no repeated layers to checkpoint (no ModuleList or "
                "Sequential of same-typed modules); keep them in self.blocks or drop "
                "[strategies.checkpoint]"
            )
        picked = range(0, len(blocks), settings.every)
        context = {"context_fn": selective_context} if settings.policy == "selective" else {}
        for i in picked:
            # torch's wrapper (non-reentrant checkpoint) also composes with FSDP.
            blocks[i] = checkpoint_wrapper(blocks[i], **context)
        setup.notes.append(f"checkpoint ({settings.policy}): {len(picked)} of "
                           f"{blocks.describe()}")


def _saved_ops() -> frozenset:
    """The ops whose outputs selective checkpointing keeps: the matmuls and the attention
    kernels (what costs FLOPs to recompute); everything else is recomputed."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


SAVED_OPS = _saved_ops()


def _policy(ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return (CheckpointPolicy.MUST_SAVE if func in SAVED_OPS
            else CheckpointPolicy.PREFER_RECOMPUTE)


def selective_context():
    """torch.utils.checkpoint's context_fn for op-level selective checkpointing."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


register(Checkpoint())
