"""Peak FLOP/s of a device, the denominator of MFU: the datasheet, and the matmul dtype.

Two figures, both recorded with every result:

- the **datasheet** peak: the vendor's published dense (no 2:4 sparsity) tensor
  throughput for the device and the dtype the matmuls actually run in (the table
  here, `datasheet_peak`);
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
import re
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.errors import HarnessError

DTYPES = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Peak:
    """A peak rate in FLOP/s and where it comes from, in words."""

    flops: float
    source: str  # "datasheet: NVIDIA H100 SXM bf16 dense" / "measured: 8192x8192 bf16 matmul, ..."


# --- the datasheet ---------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    label: str
    pattern: re.Pattern[str]
    flops: dict[str, float]
    note: str = ""


def _row(label: str, pattern: str, note: str = "", **flops: float) -> _Row:
    return _Row(label, re.compile(pattern, re.IGNORECASE), flops, note)


# Dense figures (half the "with sparsity" numbers of the spec sheets). fp32 is the
# plain (non-tensor) FMA rate; tf32/bf16/fp16 are tensor-core rates with fp32
# accumulation (what PyTorch's matmuls use). A dtype a device lacks is left out:
# lookup then gives None and the measured peak is used.
# Rows are tried in order and the first match wins: specific variants come before
# the generic name of their family, and patterns use word boundaries so that
# "GH200" is not "H200", "A100" is not "A10", "L40S" is not "L40" or "L4".
_HOPPER_SXM = {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}
_HOPPER_NVL = {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12}
_A100 = {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}

_DATASHEET: tuple[_Row, ...] = (
    # NVIDIA Blackwell
    _row("NVIDIA GB200", r"\bGB200\b", fp32=80e12, tf32=1.25e15, bf16=2.5e15, fp16=2.5e15),
    _row(
        "NVIDIA B200",
        r"\bB200\b",
        fp32=75e12,
        tf32=1.1e15,
        bf16=2.25e15,
        fp16=2.25e15,
        note="HGX B200 at 1000 W",
    ),
    # NVIDIA Hopper
    _row("NVIDIA GH200", r"\bGH200\b", **_HOPPER_SXM),
    _row("NVIDIA H200 NVL", r"\bH200\b.*\bNVL\b", **_HOPPER_NVL),
    _row("NVIDIA H200 SXM", r"\bH200\b(?!.*\bNVL\b)", **_HOPPER_SXM),
    _row(
        "NVIDIA H100 PCIe",
        r"\bH100\b.*\bPCIe\b",
        fp32=51.2e12,
        tf32=378e12,
        bf16=756.5e12,
        fp16=756.5e12,
    ),
    _row("NVIDIA H100 NVL", r"\bH100\b.*\bNVL\b", **_HOPPER_NVL),
    # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 ...", plain "NVIDIA H100"
    _row("NVIDIA H100 SXM", r"\bH100\b(?!.*\b(?:PCIe|NVL)\b)", **_HOPPER_SXM),
    # NVIDIA Ampere
    _row("NVIDIA A100 PCIe", r"\bA100\b.*\bPCIe\b", **_A100),
    _row("NVIDIA A100 SXM", r"\bA100\b(?!.*\bPCIe\b)", **_A100),
    _row(
        "NVIDIA A10G",
        r"\bA10G\b",
        fp32=35e12,
        tf32=35e12,
        bf16=70e12,
        fp16=70e12,
        note="AWS variant; NVIDIA publishes no sheet, figures from its clocks and AWS",
    ),
    _row("NVIDIA A10", r"\bA10\b", fp32=31.2e12, tf32=62.5e12, bf16=125e12, fp16=125e12),
    _row(
        "NVIDIA GeForce RTX 3090 Ti",
        r"\bRTX 3090 Ti\b",
        fp32=40e12,
        tf32=40e12,
        bf16=80e12,
        fp16=80e12,
    ),
    _row(
        "NVIDIA GeForce RTX 3090",
        r"\bRTX 3090\b(?!\s*Ti\b)",
        fp32=35.6e12,
        tf32=35.6e12,
        bf16=71e12,
        fp16=71e12,
    ),
    # NVIDIA Ada
    _row("NVIDIA L40S", r"\bL40S\b", fp32=91.6e12, tf32=183e12, bf16=362.05e12, fp16=362.05e12),
    _row("NVIDIA L40", r"\bL40\b", fp32=90.5e12, tf32=90.5e12, bf16=181.05e12, fp16=181.05e12),
    _row("NVIDIA L4", r"\bL4\b", fp32=30.3e12, tf32=60e12, bf16=121e12, fp16=121e12),
    _row(
        "NVIDIA GeForce RTX 4090",
        r"\bRTX 4090\b(?!\s*(?:D\b|Laptop))",
        fp32=82.6e12,
        tf32=82.6e12,
        bf16=165.2e12,
        fp16=165.2e12,
    ),
    # NVIDIA Volta / Turing: no bf16 or tf32 tensor cores
    _row("NVIDIA V100S PCIe", r"\bV100S\b", fp32=16.4e12, fp16=130e12),
    _row("NVIDIA V100 SXM2", r"\bV100\b.*\bSXM", fp32=15.7e12, fp16=125e12),
    _row("NVIDIA V100 PCIe", r"\bV100\b.*\bPCIe\b", fp32=14e12, fp16=112e12),
    _row("NVIDIA T4", r"\bT4\b", fp32=8.1e12, fp16=65e12),
    # AMD Instinct (fp32 is the matrix-core rate, which rocBLAS/hipBLASLt use)
    _row("AMD MI300X", r"\bMI300X\b", fp32=163.4e12, tf32=653.7e12, bf16=1307.4e12, fp16=1307.4e12),
    _row(
        "AMD MI250X",
        r"\bMI250X\b",
        fp32=47.85e12,
        bf16=191.5e12,
        fp16=191.5e12,
        note="per GCD: torch sees each of the two dies as a device, half the OAM figure",
    ),
)


def datasheet_peak(device_name: str, dtype: str) -> Peak | None:
    """The vendor's dense peak for `device_name` (as torch names it) in `dtype`.

    None when the device is not in the table, lacks that dtype, or is a MIG slice
    (whose share of the GPU the name does not tell).
    """
    _check_dtype(dtype)
    if re.search(r"\bMIG\b", device_name):
        return None
    for row in _DATASHEET:
        if row.pattern.search(device_name):
            flops = row.flops.get(dtype)
            if flops is None:
                return None
            note = f" ({row.note})" if row.note else ""
            return Peak(flops, f"datasheet: {row.label} {dtype} dense{note}")
    return None


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
