"""Peak FLOP/s of a device, the denominator of MFU: the datasheet, and the matmul dtype.

Two figures, both recorded with every result:

- the **datasheet** peak: the vendor's published dense (no 2:4 sparsity) tensor
  throughput for the device and the dtype the matmuls actually run in (the table
  of harness.core.gpus, `datasheet_peak`);
- the **measured** peak: the best rate of a square calibration matmul on this
  device, cached so it is measured once (`harness.measure.peak_calibration`).

This module owns the datasheet, the `Peak` record and the dtype the matmuls really
run in (`matmul_dtype`, `autocast_dtype_name`); it imports nothing else of the
harness's measuring. `harness.measure.peak_calibration` imports from here, and
`harness.measure.peak_choice` imports both and chooses the figure MFU uses
(`peaks_for`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.errors import HarnessError
from harness.core.gpus import GPUS, gpu_named

DTYPES = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Peak:
    """A peak rate in FLOP/s and where it comes from, in words."""

    flops: float
    source: str  # "datasheet: NVIDIA H100 SXM bf16 dense" / "measured: 8192x8192 bf16 matmul, ..."


# --- the datasheet ----------------------------------------------------------------
# One table for the whole harness (peaks, bandwidths, the --target sheets): harness.core.gpus.
_DATASHEET = GPUS


def datasheet_peak(device_name: str, dtype: str) -> Peak | None:
    """The vendor's dense peak for `device_name` (as torch names it) in `dtype`.

    None when the device is not in the table, lacks that dtype, or is a MIG slice
    (whose share of the GPU the name does not tell).
    """
    _check_dtype(dtype)
    row = gpu_named(device_name)
    flops = row.flops.get(dtype) if row is not None else None
    if row is None or flops is None:
        return None
    note = f" ({row.note})" if row.note else ""
    return Peak(flops, f"datasheet: {row.label} {dtype} dense{note}")


# --- which dtype the matmuls really run in ----------------------------------------


def _cuda_fp32_uses_tf32() -> tuple[bool, str]:
    """Whether float32 matmuls on CUDA run on TF32 tensor cores, and the setting that says so."""
    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return False, "NVIDIA_TF32_OVERRIDE=0"
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)  # torch >= 2.9 API
    if precision in ("tf32", "ieee"):
        return precision == "tf32", f"fp32_precision={precision}"
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # settings mixed between the old and new APIs
        return False, "precision unknown"
    return legacy in ("high", "medium"), f"float32_matmul_precision={legacy}"


def _cuda_conv_uses_tf32() -> tuple[bool, str]:
    """Whether float32 convolutions on CUDA run on TF32 tensor cores. cuDNN's default
    is yes (unlike matmuls'), so an fp32 ResNet runs at TF32 rates out of the box."""
    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return False, "NVIDIA_TF32_OVERRIDE=0"
    conv = getattr(torch.backends.cudnn, "conv", None)
    precision = getattr(conv, "fp32_precision", None)  # torch >= 2.9 API
    if precision in ("tf32", "ieee"):
        return precision == "tf32", f"cudnn.conv.fp32_precision={precision}"
    allowed = bool(torch.backends.cudnn.allow_tf32)
    return allowed, f"cudnn.allow_tf32={allowed}"


def tf32_settings(convolutions: bool) -> str:
    """The settings that decide fp32's tensor-core use on CUDA, in words (for records)."""
    said = [f"matmul {_cuda_fp32_uses_tf32()[1]}"]
    if convolutions:
        said.append(f"convolution {_cuda_conv_uses_tf32()[1]}")
    return ", ".join(said)


def matmul_dtype(device: torch.device, dtype: str, convolutions: bool = False) -> str:
    """The dtype the model's matrix work runs in: "fp32" becomes "tf32" where CUDA runs
    it on TF32 tensor cores: the matmuls' setting, and for a model with convolutions
    (`convolutions`) cuDNN's too; either one on makes the TF32 peak the denominator,
    so MFU can never pass 100% on the tensor cores' work.

    On ROCm TF32 (xf32) needs more than torch's setting, so fp32 stays fp32 there.
    """
    _check_dtype(dtype)
    if dtype == "fp32" and device.type == "cuda" and torch.version.hip is None:
        tf32 = _cuda_fp32_uses_tf32()[0] or (convolutions and _cuda_conv_uses_tf32()[0])
        return "tf32" if tf32 else "fp32"
    return dtype


def autocast_dtype_name(plan_strategies: dict[str, Any]) -> str:
    """The compute dtype of a plan: its amp dtype ("bf16"/"fp16"), else "tf32" under
    [strategies.tf32] (set only during its steps, so the preparing process cannot see
    it: the MFU of a TF32 trial is over the TF32 peak), else "fp32"."""
    amp = plan_strategies.get("amp")
    if amp is None:
        return "tf32" if "tf32" in plan_strategies else "fp32"
    raw = str((amp or {}).get("dtype", "bf16")).lower().removeprefix("torch.")
    names = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}
    if raw not in names:
        raise HarnessError(f"strategies.amp.dtype = {raw!r}: use 'bf16' or 'fp16'")
    return names[raw]


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
