"""What a stored record says about its trial: the questions the tuner, its summary and
the report ask of records (plain dicts, as trials.jsonl holds them).

    busy_note     measured while other work used the machine: why its figure is not its own
    is_reference  a trial of the search (baseline, known-good, search), not a repeat
    finished      measured to the end, or found unable to run: not cut short by time or
                  left behind by a worker that stopped
    may_be_best   ok, quiet, within the memory budget: a candidate for the study's best
    budget_peak_bytes  the figure judged against the memory budget: what a trial needed
    ranked        the search's measured configurations (duplicates once), fastest first
"""

from __future__ import annotations

import math
from typing import Any

from training_harness.core.memory_need import budget_peak_bytes
from training_harness.records.tags import PRUNED_TIME, REFERENCE_PHASES, tags_of

# Below this share of the window with a kernel running (NVML's utilisation), the GPU
# waited on the host: on an H200 GPT-2 small at micro-batch 64 kept it 96-100% busy,
# the tiny plans (steps of 6-30 ms) 12-46%, and those moved by up to 45% between two
# lent machines with the same GPU (docs/benchmarks/gpu_h200_2026-11-27b.md).
HOST_BOUND_BELOW_PCT = 80.0
HOST_BOUND_WHY = ("the host's kernel launches bound the step, so this figure depends on "
                  "the CPU as much as on the GPU")


def gpu_busy_pct(record: dict[str, Any]) -> float | None:
    """The share (%) of the measured window the GPU ran a kernel, as NVML sampled it;
    None off a GPU or without NVML."""
    value = ((record.get("metrics") or {}).get("nvml") or {}).get("utilization_mean_pct")
    return float(value) if isinstance(value, (int, float)) else None


def host_bound_note(record: dict[str, Any]) -> str | None:
    """Why a GPU record's speed is the host's as much as the GPU's: "the GPU ran kernels
    35% of the window", where that is under HOST_BOUND_BELOW_PCT; None otherwise."""
    busy = gpu_busy_pct(record)
    if busy is None or busy >= HOST_BOUND_BELOW_PCT:
        return None
    return f"the GPU ran kernels {busy:.0f}% of the window: {HOST_BOUND_WHY}"


def busy_note(record: dict[str, Any]) -> str | None:
    """Why a record's measurement is not to be trusted, when its trial was flagged as
    measured beside other work (metrics.interference, training_harness.core.interference):
    "others used 54% of the CPUs; 1 other process on the GPU". None when it was quiet."""
    seen = (record.get("metrics") or {}).get("interference") or {}
    if not seen.get("flagged"):
        return None
    parts = [f"others used {seen.get('other_cpu_share') or 0:.0%} of the CPUs"]
    gpus = seen.get("other_gpu_processes") or []
    if gpus:
        parts.append(f"{len(gpus)} other process{'es' if len(gpus) > 1 else ''} on the GPU")
    return "; ".join(parts)


def is_reference(record: dict[str, Any]) -> bool:
    """A trial the search measured (phase baseline, known-good or search); confirmation
    and ablation trials measure those configurations again."""
    return tags_of(record).get("phase") in REFERENCE_PHASES


def finished(record: dict[str, Any]) -> bool:
    """Whether a record measured its configuration to the end (or found it cannot run):
    not stopped by time, not left behind by a worker that stopped."""
    tags = tags_of(record)
    return (tags.get("pruned") != PRUNED_TIME and not tags.get("deadline")
            and not tags.get("orphan"))


def may_be_best(record: dict[str, Any], budget_bytes: float | None) -> bool:
    """An ok trial within the memory budget, measured on a quiet machine: a candidate for
    the study's best. (The trials Optuna holds feasible: its `memory` constraint,
    training_harness.tune.optuna_outcome, is (needed - budget) / budget <= 0, the memory needed
    as `budget_peak_bytes` says.)"""
    if record["status"] != "ok" or busy_note(record):
        return False
    if not budget_bytes:
        return True
    peak = budget_peak_bytes(record)
    return not peak or (float(peak) - budget_bytes) / budget_bytes <= 0


def ranked(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured configurations (duplicates once), fastest first."""
    seen, rows = set(), []
    for r in records:
        if not is_reference(r) or "duplicate_of" in tags_of(r):
            continue
        if r["status"] == "ok" and r["trial_id"] not in seen:
            seen.add(r["trial_id"])
            rows.append(r)
    if any(r["metrics"].get("time_to_target_s") for r in rows):  # objective time_to_loss
        return sorted(rows, key=lambda r: r["metrics"].get("time_to_target_s") or math.inf)
    return sorted(rows, key=lambda r: -(r["metrics"].get("samples_per_s") or 0))
