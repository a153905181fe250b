"""Peak memory of a trial: what the device held for it, and the process's peak RSS.

    tracker = MemoryTracker(device)
    tracker.begin()
    ...                              # the steps
    memory = tracker.end()           # {"allocated", "reserved", "device_held", "rss", ...}

The allocator's peaks count only tensors (allocated) and the blocks the caching
allocator holds (reserved); the CUDA context, cuBLAS workspaces and NCCL's buffers
are outside them. NVML's per-process figure (training_harness.measure.nvml) sees those:
`device_held` is the trial's peak.

Under a study's memory budget each rank's caching allocator is capped (`apply_memory_cap`,
before the model is built: it frees its cache and retries before it passes the cap), so
what the device held may include cache the trial did not need. Such a trial is judged
by what it needed: the allocator's reserved peak plus the measured context
(`context_bytes`; training_harness.core.memory_need.budget_peak_bytes).

The RSS peak since `begin` comes from Linux's VmHWM after resetting it through
/proc/self/clear_refs. Where the reset is refused, or there is no /proc, the
peak is the process's lifetime peak, and `rss_source` says so.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Any

import psutil
import torch

from training_harness.measure.nvml import process_memory_bytes


def _status_kib(field: str) -> int | None:
    """A "VmXxx:  123 kB" line of /proc/self/status, in bytes."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def current_rss() -> int | None:
    """The process's resident set size now, in bytes."""
    rss = _status_kib("VmRSS")
    if rss is None:
        try:
            rss = int(psutil.Process().memory_info().rss)
        except Exception:
            rss = None
    return rss


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _lifetime_maxrss() -> int:
    """ru_maxrss of this process: KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def apply_memory_cap(device: torch.device, budget_bytes: int | None,
                     context_bytes: int | None = None) -> int | None:
    """Cap this process's caching allocator on `device` at the memory budget less the
    context measured before the model (so reserved + context stays within the budget);
    returns the cap in bytes, None where nothing is capped (no budget, not CUDA).
    Call it before the model is built. GPU: correct by construction, not yet run on one."""
    if device.type != "cuda" or not budget_bytes:
        return None
    total = int(torch.cuda.get_device_properties(device).total_memory)
    cap = max(1, int(budget_bytes) - int(context_bytes or 0))
    fraction = min(1.0, cap / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return int(fraction * total)


def set_expandable_segments(device: torch.device, on: bool) -> None:
    """The allocator's expandable segments, as PYTORCH_CUDA_ALLOC_CONF (set by the launcher,
    training_harness.launch.local.allocator_env) asks, for a rank forked after torch was
    imported."""
    # torch 2.11 deprecates the cuda one for the accelerator-wide setter (a FutureWarning)
    setter = (getattr(torch._C, "_accelerator_setAllocatorSettings", None)
              or getattr(torch.cuda.memory, "_set_allocator_settings", None))
    if device.type == "cuda" and setter is not None:
        setter(f"expandable_segments:{on}")


class MemoryTracker:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cap_bytes: int | None = None  # the allocator's cap (apply_memory_cap), if any
        self.context_bytes: int | None = None  # held before the model, measured in begin
        self.context_source: str | None = None
        self._rss_base: int | None = None
        self._device_base: int | None = None
        self._hwm_reset = False
        self._begun = False

    def begin(self) -> None:
        """Reset the peaks: the allocator's on CUDA, the process's peak RSS on Linux; and
        note what the device holds for this process before the model (its CUDA context)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._device_base = process_memory_bytes(self.device)
            self.context_bytes, self.context_source = self._device_base, "NVML, this process"
            if self._device_base is None:  # no per-process figure (containers)
                free, total = torch.cuda.mem_get_info(self.device)
                self.context_bytes = max(0, int(total) - int(free)
                                         - int(torch.cuda.memory_reserved(self.device)))
                self.context_source = "device used before the model (mem_get_info)"
        self._hwm_reset = _reset_peak_rss()
        self._rss_base = current_rss()
        self._begun = True

    def end(self, process_peak: int | None = None) -> dict[str, Any]:
        """Peaks since `begin`, in bytes; None where a figure cannot be measured.

        On CUDA, `device_held` is what the device held for this process at its most:
        NVML's per-process figure (the larger of `process_peak`, sampled while the steps
        ran, and a reading now), which counts the CUDA context, the allocator's cached
        blocks and NCCL's buffers; else the allocator's reserved peak. A memory budget is
        checked against it: allocated bytes fit where the device can still run out."""
        allocated = reserved = held = None
        held_source = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            allocated = int(torch.cuda.max_memory_allocated(self.device))
            reserved = int(torch.cuda.max_memory_reserved(self.device))
            readings = [v for v in (process_peak, process_memory_bytes(self.device)) if v]
            if readings:
                held, held_source = max(readings), "NVML, this process"
            else:
                held, held_source = reserved, "allocator reserved (no per-process NVML figure)"
        hwm = _status_kib("VmHWM")
        if hwm is not None:
            rss = hwm
            source = "VmHWM since begin" if self._hwm_reset else "VmHWM, process lifetime"
        else:
            rss = _lifetime_maxrss()
            source = "ru_maxrss, process lifetime"
        return {
            "allocated": allocated,
            "reserved": reserved,
            "device_held": held,
            "device_held_source": held_source,
            "device_base": self._device_base,  # held before the model: the CUDA context
            "nvml_per_process": (self._device_base is not None or bool(
                held_source and held_source.startswith("NVML"))) if allocated is not None
            else None,
            "context_bytes": self.context_bytes,
            "context_source": self.context_source,
            "cap_bytes": self.cap_bytes,  # the allocator's cap: the budget less the context
            "rss": rss,
            "rss_base": self._rss_base,
            "rss_source": source if self._begun else source + " (begin not called)",
        }


def peak_memory_bytes(d: dict[str, Any]) -> int | None:
    """The figure a result reports as its peak: what the device held on GPU (see
    `MemoryTracker.end`), the RSS peak on CPU."""
    for key in ("device_held", "reserved", "allocated"):
        if d.get(key) is not None:
            return int(d[key])
    rss = d.get("rss")
    return int(rss) if rss is not None else None


def device_memory_bytes(device_type: str) -> int:
    """Memory of one device: the first CUDA device's, or this machine's RAM on a CPU."""
    if device_type == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(psutil.virtual_memory().total)
