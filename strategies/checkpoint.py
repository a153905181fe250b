"""Activation checkpointing: keep a block's input, recompute its inside in backward."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from harness.core.errors import HarnessError
from harness.workloads.blocks import find_blocks
from strategies.base import Choice, Phase, Strategy
from strategies.registry import register


@dataclass
class CheckpointSettings:
    every: int = 1  # checkpoint blocks 0, k, 2k, ...; 1 checkpoints all of them

    def validate(self, where: str) -> None:
        if self.every < 1:
            raise HarnessError(f"{where}.every: must be 1 or more (1 = every block)")


class Checkpoint(Strategy):
    name = "checkpoint"
    summary = "activation checkpointing of every k-th block (trades recompute for memory)"
    phases = (Phase.CHECKPOINT,)
    Settings = CheckpointSettings
    requires = ("a model with repeated layers: `model.blocks`, or found (HF decoder layers, "
                "torchvision stages)")

    def space(self):
        return {"every": Choice((1, 2, 4))}

    def apply(self, phase, setup, settings):
        blocks = find_blocks(setup.model)
        if blocks is None:
            raise HarnessError(
                "checkpoint: the model has no repeated layers to checkpoint (no ModuleList or "
                "Sequential of same-typed modules); keep them in self.blocks or drop "
                "[strategies.checkpoint]"
            )
        wrapped = 0
        for i in range(0, len(blocks), settings.every):
            # torch's wrapper (non-reentrant checkpoint) also composes with FSDP.
            blocks[i] = checkpoint_wrapper(blocks[i])
            wrapped += 1
        setup.notes.append(f"checkpoint: {wrapped} of {blocks.describe()}")


register(Checkpoint())
