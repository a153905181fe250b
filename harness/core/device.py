"""Which device a plan runs on, what it can do, and how to wait for it."""

from __future__ import annotations

import contextlib
import importlib.util
import platform
from dataclasses import dataclass

import torch

from training_harness.core.errors import HarnessError


@dataclass(frozen=True)
class RuntimeEnv:
    """What strategy checks need to know about this machine."""

    device_type: str  # "cpu" or "cuda"
    device_name: str
    device_count: int  # devices of device_type on this node
    bf16: bool
    triton: bool

    @classmethod
    def detect(cls, requested: str = "auto") -> RuntimeEnv:
        device = resolve_device(requested)
        if device.type == "cuda":
            return cls(
                device_type="cuda",
                device_name=torch.cuda.get_device_name(0),
                device_count=torch.cuda.device_count(),
                # not emulated: that check would allocate, making a CUDA context here
                bf16=torch.cuda.is_bf16_supported(including_emulation=False),
                triton=importlib.util.find_spec("triton") is not None,
            )
        return cls(
            device_type="cpu",
            device_name=cpu_name(),
            device_count=1,
            bf16=True,  # CPU autocast supports bf16 everywhere (slowly without AMX/AVX512-BF16)
            triton=importlib.util.find_spec("triton") is not None,
        )


def resolve_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise HarnessError(
                "device = 'cuda' but no CUDA device is visible here; "
                "set device = 'cpu' or 'auto'"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if requested == "cpu":
        return torch.device("cpu")
    raise HarnessError(f"device = {requested!r}: use 'auto', 'cpu' or 'cuda'")


def synchronize(device: torch.device) -> None:
    """Wait until every queued operation on `device` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# The instruction-set extensions that decide how fast a CPU trains: bf16 autocast is
# 17-37x slower than fp32 on a CPU without AVX-512 BF16 or AMX (seen on this project's
# machines, which changed between two days).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_int8", "avx_vnni", "asimd", "sve", "sve2", "bf16")


def cpu_capability() -> str:
    """torch's name for the vector instructions its CPU kernels use here (AVX2, AVX512...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an old torch, or a platform it cannot read
        return "unknown"


def cpu_flags() -> list[str]:
    """Which of CPU_FLAGS this CPU has (from /proc/cpuinfo; empty where there is none)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [flag for flag in CPU_FLAGS if flag in have]
    return []
