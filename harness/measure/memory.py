"""Peak memory of a trial: the CUDA allocator's peaks, and the process's peak RSS.

    tracker = MemoryTracker(device)
    tracker.begin()
    ...                              # the steps
    memory = tracker.end()           # {"allocated", "reserved", "rss", "rss_base", "rss_source"}

The allocator's peaks count only tensors (allocated) and the blocks the caching
allocator holds (reserved); the CUDA context, cuBLAS workspaces and other
processes are outside them (NVML's figure, see harness.measure.nvml, sees those).

The RSS peak since `begin` comes from Linux's VmHWM after resetting it through
/proc/self/clear_refs. Where the reset is refused, or there is no /proc, the
peak is the process's lifetime peak, and `rss_source` says so.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

try:
    import psutil
except ImportError:  # psutil is a dependency, but RSS still works from /proc without it
    psutil = None


def _status_kib(field: str) -> int | None:
    """A "VmXxx:  123 kB" line of /proc/self/status, in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss() -> int | None:
    """The process's resident set size now, in bytes."""
    rss = _status_kib("VmRSS")
    if rss is None and psutil is not None:
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


class MemoryTracker:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rss_base: int | None = None
        self._hwm_reset = False
        self._begun = False

    def begin(self) -> None:
        """Reset the peaks: the allocator's on CUDA, the process's peak RSS on Linux."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._hwm_reset = _reset_peak_rss()
        self._rss_base = current_rss()
        self._begun = True

    def end(self) -> dict[str, Any]:
        """Peaks since `begin`, in bytes; None where a figure cannot be measured."""
        allocated = reserved = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            allocated = int(torch.cuda.max_memory_allocated(self.device))
            reserved = int(torch.cuda.max_memory_reserved(self.device))
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
            "rss": rss,
            "rss_base": self._rss_base,
            "rss_source": source if self._begun else source + " (begin not called)",
        }


def peak_memory_bytes(d: dict[str, Any]) -> int | None:
    """The figure a result reports as its peak: the allocator's on GPU, the RSS peak on CPU."""
    if d.get("allocated") is not None:
        return int(d["allocated"])
    rss = d.get("rss")
    return int(rss) if rss is not None else None


def device_memory_bytes(device_type: str) -> int:
    """Memory of one device: the first CUDA device's, or this machine's RAM on a CPU."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)
