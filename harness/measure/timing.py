"""Timing training steps honestly: every timed step ends in a device synchronisation."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class StepTimer:
    """Wall-clock time per step, each ending in a synchronisation of `device`.

    On CUDA the step is bracketed by CUDA events and the end event is waited on,
    so the time covers the kernels the step queued, not just their launch. A
    `barrier` callable (distributed trials) runs before each step starts, so the
    ranks begin together and the slowest rank sets the step time.
    """

    def __init__(self, device: torch.device, barrier=None):
        self.device = device
        self.barrier = barrier
        self.times_s: list[float] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        if self.barrier is not None:
            self.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            end.synchronize()
            self.times_s.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            yield
            self.times_s.append(time.perf_counter() - t0)


def step_time_stats(times_s: list[float]) -> dict[str, float | int]:
    """Median with p10/p90 and n (the record's keys), plus mean/stdev/min/max."""
    if not times_s:
        raise ValueError("no measured steps")
    ordered = sorted(times_s)
    return {
        "median": statistics.median(ordered),
        "p10": _quantile(ordered, 0.10),
        "p90": _quantile(ordered, 0.90),
        "n": len(ordered),
        "mean": statistics.fmean(ordered),
        "stdev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "min": ordered[0],
        "max": ordered[-1],
    }


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
