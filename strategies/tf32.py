"""TF32: float32 matmuls and convolutions on the tensor cores (Ampere or newer).

The weights, activations and gradients stay float32; only the matmul inputs are
rounded to TF32's 10-bit mantissa inside the tensor cores. It is what people mean
by "fp32" on an A100/H100 unless they turn it off, and what the harness's
baseline does not do: the baseline is strict fp32 (TF32 off, torch's default).

The flags are process-wide, so the strategy sets them around each training step
(`Setup.step_contexts`) and restores what was there before, leaving the process
as it found it between steps and after the trial.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from training_harness.strategies.attention_backends import cuda_capability
from training_harness.strategies.base import Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class Tf32Settings:
    # torch.set_float32_matmul_precision: "high" is TF32 (or bf16x3), "medium" bf16.
    matmul_precision: Literal["high", "medium"] = "high"
    cudnn: bool = True  # torch.backends.cudnn.allow_tf32 (convolutions)


@contextlib.contextmanager
def tf32_enabled(settings: Tf32Settings) -> Iterator[None]:
    """TF32 on inside the block; the previous precision and cuDNN flag restored after."""
    before = torch.get_float32_matmul_precision()
    cudnn_before = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(settings.matmul_precision)
    torch.backends.cudnn.allow_tf32 = settings.cudnn
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
        torch.backends.cudnn.allow_tf32 = cudnn_before


class Tf32(Strategy):
    name = "tf32"
    summary = ("fp32 with TF32 tensor-core matmuls (float32 matmul precision 'high', cuDNN "
               "TF32); the baseline is strict fp32")
    phases = (Phase.STEP,)
    Settings = Tf32Settings
    requires = "a CUDA GPU with TF32 tensor cores (Ampere, compute capability 8.0, or newer)"

    def check(self, settings, plan, env):
        if env.device_type != "cuda":
            return [
                f"tf32 is a CUDA tensor-core format; on {env.device_type} float32 matmuls "
                "have no TF32 path, so the trial would be the strict fp32 one: drop "
                "[strategies.tf32] (or use amp dtype = 'bf16')"
            ]
        cap = cuda_capability()
        if cap is not None and cap[0] < 8:
            return [
                f"tf32 needs compute capability 8.0 or newer (Ampere); {env.device_name} "
                f"is {cap[0]}.{cap[1]}: drop [strategies.tf32] or use amp dtype = 'fp16'"
            ]
        return []

    def apply(self, phase, setup, settings):
        setup.step_contexts.append(lambda: tf32_enabled(settings))
        setup.notes.append(
            f"tf32: float32 matmul precision '{settings.matmul_precision}'"
            + (", cuDNN TF32" if settings.cudnn else "") + " during each step"
        )


register(Tf32())
