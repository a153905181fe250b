"""FP8 training on Hopper: torchao's float8 linears (tensorwise or rowwise scaling).

`torchao.float8.convert_to_float8_training` swaps `nn.Linear` for `Float8Linear`,
whose matmuls run in float8 (e4m3) with dynamic scales: one per tensor
("tensorwise", the fastest) or one per row ("rowwise", more accurate). The
filter keeps in high precision (bf16 under amp) what torchtitan keeps there: the
first and the last linear (the first layer's input projection and the output
head, the most sensitive to rounding) and the small linears whose dimensions are
not multiples of 16 (the float8 matmul `torch._scaled_mm` needs them, and they
would not be faster).

It acts after tensor parallel and before the data-parallel wrapper (FSDP), as
torchtitan composes it, at `Phase.LOW_PRECISION`. Searched on CUDA devices of
compute capability 8.9 or newer (Ada, Hopper); refused elsewhere, and where
torchao is not installed (`pip install -e .[fp8]`). `emulate = true` runs the same
casts and scales with high-precision matmuls (torchao's emulation): a
correctness check on any device, never a speed-up, so never searched.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Literal

from torch import nn

from training_harness.core import versions
from training_harness.strategies.attention_backends import cuda_capability
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register

MIN_CAPABILITY = (8, 9)


@dataclass
class Float8Settings:
    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    keep_first_last: bool = True  # the first and the last linear stay in high precision
    emulate: bool = False  # torchao's emulation: float8 casts, high-precision matmuls


def linear_filter(model: nn.Module, keep_first_last: bool = True):
    """torchao's module_filter_fn: True for the linears to convert; False for the first
    and the last linear (when kept) and for any linear with a dimension not divisible
    by 16."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    kept = {linears[0], linears[-1]} if keep_first_last and linears else set()

    def convert(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn in kept:
            return False
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    return convert


def config(settings: Float8Settings):
    from torchao.float8 import Float8LinearConfig

    return replace(Float8LinearConfig.from_recipe_name(settings.recipe),
                   emulate=settings.emulate)


class Float8(Strategy):
    name = "float8"
    summary = ("FP8 training through torchao's float8 linears (tensorwise or rowwise "
               "scaling); the first and last linear and small linears stay bf16")
    phases = (Phase.LOW_PRECISION,)
    Settings = Float8Settings
    requires = ("torchao (the [fp8] extra) and a CUDA device of compute capability 8.9 or "
                "newer (Ada, Hopper); emulate = true runs anywhere, slowly")

    def space(self):
        return {"recipe": Choice(("tensorwise", "rowwise"))}

    def check(self, settings, plan, env):
        reasons = []
        if importlib.util.find_spec("torchao") is None:
            reasons.append("float8 needs torchao, which is not installed here: "
                           "pip install -e '.[fp8]' (or drop [strategies.float8])")
        elif drift := versions.drift(["torchao"]):
            reasons.append(f"float8: {drift[0]}")  # torchao is built for one torch minor
        if not settings.emulate:
            if env.device_type != "cuda":
                reasons.append(
                    f"float8 needs a CUDA device of compute capability 8.9 or newer (float8 "
                    f"tensor cores); {env.device_type} has none (emulate = true checks "
                    "correctness only)")
            else:
                cap = cuda_capability()
                if cap is not None and cap < MIN_CAPABILITY:
                    reasons.append(
                        f"float8 needs compute capability 8.9 or newer (Ada, Hopper); "
                        f"{env.device_name} is {cap[0]}.{cap[1]}")
        if plan.layout.tensor > 1:
            reasons.append(
                "float8 with tensor parallel needs torchao's float8 parallel styles "
                "(Float8ColwiseParallel ...), which the tensor strategy does not use: "
                "set layout.tensor = 1 or drop [strategies.float8]")
        return reasons

    def apply(self, phase, setup, settings):
        from torchao.float8 import convert_to_float8_training

        before = sum(isinstance(m, nn.Linear) for m in setup.model.modules())
        convert_to_float8_training(
            setup.model, config=config(settings),
            module_filter_fn=linear_filter(setup.model, settings.keep_first_last))
        from torchao.float8.float8_linear import Float8Linear

        swapped = sum(isinstance(m, Float8Linear) for m in setup.model.modules())
        setup.notes.append(
            f"float8 ({settings.recipe}{', emulated' if settings.emulate else ''}): "
            f"{swapped} of {before} linears")


register(Float8())
