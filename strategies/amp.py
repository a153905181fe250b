"""Automatic mixed precision: bf16 autocast, or fp16 autocast with loss scaling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class AmpSettings:
    dtype: Literal["bf16", "fp16"] = "bf16"
    init_scale: float = 2.0**16  # fp16 only: the gradient scaler's first loss scale


class Amp(Strategy):
    name = "amp"
    summary = "mixed precision: bf16 autocast, or fp16 autocast with a gradient scaler"
    phases = (Phase.STEP,)
    Settings = AmpSettings
    requires = "fp16: a CUDA device; bf16: a GPU with bf16 (Ampere or newer) or a CPU"

    def space(self):
        return {"dtype": Choice(("bf16", "fp16"))}

    def check(self, settings, plan, env):
        if settings.dtype == "fp16" and env.device_type != "cuda":
            return [
                "amp dtype 'fp16' needs a CUDA device (loss scaling runs on the GPU); "
                "on the CPU use dtype = 'bf16'"
            ]
        if settings.dtype == "bf16" and not env.bf16:
            return [
                f"amp dtype 'bf16' is not supported on {env.device_name}; use dtype = 'fp16'"
            ]
        if not settings.init_scale > 0:
            return ["amp init_scale must be above 0"]
        return []

    def apply(self, phase, setup, settings):
        setup.autocast_dtype = torch.bfloat16 if settings.dtype == "bf16" else torch.float16
        if settings.dtype == "fp16":
            # Master weights stay fp32; only the loss (hence the gradients) is scaled.
            # On several ranks (gradient shards, tensor slices) torch's sharded scaler
            # agrees on inf/NaN over all of them, so every rank skips the same steps.
            scaler = ShardedGradScaler if setup.mesh is not None else torch.amp.GradScaler
            setup.grad_scaler = scaler(setup.device.type, init_scale=settings.init_scale)


register(Amp())
