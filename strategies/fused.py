"""Fused kernels: SDPA attention, foreach/fused optimizer updates, torch.compile."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Literal

from harness.workloads.attention import swap_attention
from strategies.base import Choice, Phase, Strategy
from strategies.registry import register


@dataclass
class FusedSettings:
    attention: Literal["explicit", "sdpa"] = "sdpa"
    optimizer: Literal["default", "foreach", "fused"] = "fused"
    compile: bool = False


class Fused(Strategy):
    name = "fused"
    summary = "fused kernels: scaled_dot_product_attention, fused/foreach optimizer, torch.compile"
    phases = (Phase.MODULE_SWAP, Phase.COMPILE, Phase.OPTIMIZER)
    Settings = FusedSettings
    requires = "compile: a C compiler on the CPU, Triton on a GPU"

    def space(self):
        return {
            "attention": Choice(("explicit", "sdpa")),
            "optimizer": Choice(("default", "foreach", "fused")),
            "compile": Choice((False, True)),
        }

    def check(self, settings, plan, env):
        if settings.compile and env.device_type == "cpu" and not (
            shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
        ):
            return ["fused compile on the CPU needs a C compiler (gcc); set compile = false"]
        if settings.compile and env.device_type == "cuda" and not env.triton:
            return ["fused compile on a GPU needs Triton (pip install triton); set compile = false"]
        return []

    def apply(self, phase, setup, settings):
        model = setup.model
        if phase is Phase.MODULE_SWAP:
            n = swap_attention(model, settings.attention)
            setup.notes.append(f"fused: {n} attention cores -> {settings.attention}")
        elif phase is Phase.COMPILE and settings.compile:
            # Per block, as torchtitan does: shorter compiles, and wrappers applied
            # later (pipeline split, FSDP) see ordinary modules.
            blocks = getattr(model, "blocks", None)
            for block in blocks if blocks is not None else [model]:
                block.compile()
        elif phase is Phase.OPTIMIZER:
            setup.optimizer_impl = settings.optimizer


register(Fused())
