"""Peak FLOP/s of a device, the denominator of MFU: the datasheet's and the measured.

Both figures are recorded with every result, and the record says which MFU uses:

- the **datasheet** peak: the vendor's dense (no 2:4 sparsity) tensor rate for the
  device and the dtype the matmuls really run in (`matmul_dtype`), from the one GPU
  table of the harness, training_harness.core.gpus (torch-free: `harness plan --target` and
  the estimator read it too);
- the **measured** peak: the best rate of a square calibration matmul on this device,
  cached per machine (training_harness.measure.cache) so that it is measured once. The matmul
  runs in a short-lived process of its own (training_harness.measure.calibrate): a CUDA
  context made here would stay on the trials' device for as long as the caller (the
  tuner's helper, the bench launcher) lives, holding memory and skewing NVML's
  readings.

MFU uses the datasheet figure where the device is known (the convention papers
report against) and the measured one otherwise (CPUs vary too much for a table, and
so do GPUs missing from it). A measured rate above the datasheet's by more than 10 %
means the row does not describe this device (other clocks): then the measured one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from training_harness.core.errors import HarnessError
from training_harness.core.gpus import gpu_named
from training_harness.measure import cache as store

DTYPES = ("fp32", "tf32", "bf16", "fp16")
CACHE_FILE = "peaks.json"
CALIBRATION_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Peak:
    """A peak rate in FLOP/s and where it comes from, in words."""

    flops: float
    source: str  # "datasheet: NVIDIA H100 SXM bf16 dense" / "measured: 8192x8192 bf16 matmul, ..."


@dataclass(frozen=True)
class PeakChoice:
    """Both peaks of a device, and the one MFU divides by."""

    dtype: str  # the dtype the matmuls run in ("tf32" for fp32 with TF32 on)
    datasheet: Peak | None
    measured: Peak
    used: Peak
    reason: str  # why `used` was chosen, in words

    def as_record(self) -> dict[str, Any]:
        """A JSON-ready record: both peaks, which one MFU uses, and why."""
        return {
            "dtype": self.dtype,
            "datasheet": asdict(self.datasheet) if self.datasheet else None,
            "measured": asdict(self.measured),
            "used": "datasheet" if self.used is self.datasheet else "measured",
            "flops": self.used.flops,
            "source": self.used.source,
            "reason": self.reason,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> PeakChoice:
        """The PeakChoice that `as_record` wrote (a rank reads it from prepared.json)."""
        datasheet = Peak(**record["datasheet"]) if record.get("datasheet") else None
        measured = Peak(**record["measured"])
        used = datasheet if record["used"] == "datasheet" and datasheet else measured
        return cls(record["dtype"], datasheet, measured, used, record["reason"])


def peaks_for(device: torch.device, device_name: str, dtype: str, *, cache: bool = True,
              convolutions: bool = False) -> PeakChoice:
    """Datasheet and measured peaks for `dtype` (the plan's compute dtype) on `device`;
    `convolutions`: the model has some, so cuDNN's TF32 setting counts for fp32 too."""
    eff = matmul_dtype(device, dtype, convolutions)
    sheet = datasheet_peak(device_name, eff) if device.type == "cuda" else None
    measured = measured_peak(device, eff, cache=cache)
    why = ""
    if eff == "tf32" and dtype == "fp32":
        why = f"fp32 runs on TF32 tensor cores ({tf32_settings(convolutions)}); "
    if sheet is None:
        reason = f"{why}no datasheet figure for {device_name} {eff}: MFU uses the measured peak"
        return PeakChoice(eff, None, measured, measured, reason)
    if measured.flops > 1.1 * sheet.flops:
        reason = (f"{why}measured {measured.flops / 1e12:.1f} TFLOP/s is above the datasheet's "
                  f"{sheet.flops / 1e12:.1f}: the table row does not fit this device, "
                  "MFU uses the measured peak")
        return PeakChoice(eff, sheet, measured, measured, reason)
    return PeakChoice(eff, sheet, measured, sheet, f"{why}MFU uses the datasheet peak")


def datasheet_peak(device_name: str, dtype: str) -> Peak | None:
    """The vendor's dense peak for `device_name` (as torch names it) in `dtype`; None when
    the device is not in the table, lacks that dtype, or is a MIG slice."""
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
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)  # torch >= 2.9
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
    precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
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


# --- the measured peak, cached ----------------------------------------------------


def measured_peak(device: torch.device, dtype: str, *, cache: bool = True) -> Peak:
    """The best rate of a square `dtype` matmul on `device`, in FLOP/s (2·n³ per matmul).

    "fp32" on CUDA is measured under the current TF32 setting (reported as "tf32"
    when TF32 is on, see `matmul_dtype`); "tf32" forces TF32 for the measurement.
    With `cache`, the figure is read from and stored in the cache's peaks.json.
    """
    _check_dtype(dtype)
    return measured_peaks(device, [dtype], cache=cache)[matmul_dtype(_indexed(device), dtype)]


def measured_peaks(device: torch.device, dtypes: list[str], *,
                   cache: bool = True) -> dict[str, Peak]:
    """`measured_peak` of several dtypes, keyed by the dtype each ran in; the ones not
    cached are measured together, in one calibration process (also on a CPU: the
    process that asks, the tuner's helper or `harness bench`, never runs the matmul)."""
    for dtype in dtypes:
        _check_dtype(dtype)
    device = _indexed(device)
    wanted = list(dict.fromkeys(matmul_dtype(device, d) for d in dtypes))
    keys = {d: peak_key(device, device_name(device), d) for d in wanted}
    entries = store.read(CACHE_FILE) if cache else {}
    found = {d: hit for d in wanted if (hit := _valid_entry(entries.get(keys[d]))) is not None}
    missing = [d for d in wanted if d not in found]
    if missing:
        measured = _measure_in_subprocess(device, missing)
        found.update(measured)
        if cache:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            store.add(CACHE_FILE, {keys[d]: {**asdict(p), "measured_at": stamp}
                                   for d, p in measured.items()})
    return found


def forget_measured_peak(device: torch.device, dtype: str) -> None:
    """Drop the cached figure: a trial ran faster than it, so it was measured low (on a
    loaded machine); the next study or bench measures it again."""
    device = _indexed(device)
    key = peak_key(device, device_name(device), matmul_dtype(device, dtype))
    entries = store.read(CACHE_FILE)
    if entries.pop(key, None) is not None:
        store.write(CACHE_FILE, entries)


def _valid_entry(entry: Any) -> Peak | None:
    if not isinstance(entry, dict):
        return None
    flops, source = entry.get("flops"), entry.get("source")
    if isinstance(flops, int | float) and math.isfinite(flops) and flops > 0 \
            and isinstance(source, str):
        return Peak(float(flops), source)
    return None


def _indexed(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from training_harness.core.device import cpu_name

    return cpu_name()


def peak_key(device: torch.device, device_name: str, dtype: str) -> str:
    """Everything the rate depends on: the device (on a CPU its instruction set and the
    threads torch may use, since one model name comes with AVX2 or AVX-512 BF16; on a
    GPU its UUID and top SM clock, so another card or a clock cap is measured anew),
    the dtype and torch."""
    key = f"{device.type}|{device_name}|{dtype}|torch {torch.__version__}"
    if device.type == "cpu":
        from training_harness.core.device import cpu_capability, cpu_flags

        key += f"|threads {torch.get_num_threads()}|{cpu_capability()}|{','.join(cpu_flags())}"
    elif device.type == "cuda":
        from training_harness.measure.nvml import gpu_identity  # NVML: no CUDA context

        key += f"|{gpu_identity(device)}"
    return key


# --- where the calibration runs -----------------------------------------------------

def run_module(module: str, argv: list[str], timeout_s: float, what: str) -> str:
    """The last line `python -m module argv...` prints, run as a process of its own;
    RuntimeError saying `what` failed, with the end of its stderr."""
    # the folder training_harness imports from (a wheel's site folder on PYTHONPATH)
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-m", module, *argv], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} ran past {timeout_s:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {tail}")
    return lines[-1]


def _measure_in_subprocess(device: torch.device, dtypes: list[str]) -> dict[str, Peak]:
    """The calibration of each dtype in one short-lived process
    (training_harness.measure.calibrate),
    so that the CUDA context the matmuls need ends with it instead of staying here."""
    line = run_module("training_harness.measure.calibrate", [str(device), *dtypes],
                      CALIBRATION_TIMEOUT_S, f"calibration matmul on {device}")
    answer = json.loads(line)
    peaks = {d: _valid_entry(answer.get(d)) for d in dtypes}
    if any(p is None for p in peaks.values()):
        raise RuntimeError(f"calibration on {device} answered {line!r}")
    return peaks
