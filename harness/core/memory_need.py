"""The memory a trial is judged by against a study's memory budget (torch-free: the
tuner, its report and the selftest's figures ask it of stored records, plain dicts).

A CUDA trial runs with its caching allocator capped at the budget less its context
(training_harness.measure.memory.apply_memory_cap): the allocator frees its cache and retries
before it passes the cap, so what the device held beyond the allocator's reserved peak
and the context was cache, not the trial's need.
"""

from __future__ import annotations

from typing import Any


def budget_peak_bytes(record: dict[str, Any]) -> float | None:
    """The memory a record's trial is judged by against the budget. A CUDA trial that ran
    with its allocator capped (metrics.memory.cap_bytes, training_harness.measure.memory) needed
    the allocator's reserved peak (allocated where reserved is missing) plus the context
    measured before the model: the cache the device held beyond that was the allocator's,
    not the trial's, whether or not NVML has a per-process figure. Otherwise the
    record's peak (metrics.peak_memory_bytes: what the device held, or RSS on a CPU)."""
    m = record.get("metrics") or {}
    mem = m.get("memory") or {}
    if mem.get("cap_bytes"):
        needed = mem.get("reserved") or mem.get("allocated")
        if needed:
            return float(needed) + float(mem.get("context_bytes") or 0)
    peak = m.get("peak_memory_bytes")
    return float(peak) if peak else None
