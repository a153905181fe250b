"""One TrialResult dict -> one flat row of plain values (the trial frame's columns).

Every key is optional here: a missing or malformed value becomes None (NaN in the
frame), never an exception, so one odd record cannot stop a report.
"""

from __future__ import annotations

import json
from typing import Any

from training_harness.core.memory_need import budget_peak_bytes
from training_harness.records.predicates import busy_note, gpu_busy_pct, host_bound_note
from training_harness.records.values import get, number  # the one lookup and coercion

NUMERIC = ("samples_per_s", "tokens_per_s", "step_time_median", "step_time_p10",
           "step_time_p90", "step_n", "mfu", "tflops_per_device", "peak_memory_bytes",
           "predicted_memory_bytes", "predicted_step_time_s", "energy_j_per_sample", "gpu_busy_pct",
           "loss_first", "loss_last", "duration_s", "micro_batch_size", "global_batch_size",
           "world_size", "optuna_number", "ablation_repeat", "calibrated_memory_bytes",
           "measured_for_estimate", "corrected_step_time_s", "corrected_from_trials",
           "budget_memory_bytes")


def settings_text(settings: Any) -> str:
    if not isinstance(settings, dict) or not settings:
        return ""
    return ", ".join(f"{k}={_short(v)}" for k, v in sorted(settings.items()))


def _short(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def strategies_of(plan: Any) -> dict[str, dict]:
    s = get(plan, "strategies", {})
    if isinstance(s, list):  # a list of names is accepted too
        return {str(n): {} for n in s}
    return {str(k): (v if isinstance(v, dict) else {}) for k, v in s.items()} \
        if isinstance(s, dict) else {}


def config_label(strategies: dict[str, dict]) -> str:
    """"amp(dtype=bf16) + checkpoint(every=2)", or "fp32, no strategies"."""
    if not strategies:
        return "fp32, no strategies"
    parts = []
    for name in sorted(strategies):
        text = settings_text(strategies[name])
        parts.append(f"{name}({text})" if text else name)
    return " + ".join(parts)


def _nodes(cluster: Any) -> str:
    """The job's nodes by name ("n1, n2"), else Slurm's node list ("n[1-2]")."""
    names = get(cluster, "node_names", [])
    if isinstance(names, list) and names:
        return ", ".join(str(n) for n in names)
    return str(get(cluster, "nodes", ""))


def flatten(r: dict, order: int, trial_id: str) -> dict[str, Any]:
    plan = get(r, "plan", {})
    strategies = strategies_of(plan)
    layout = get(plan, "layout", {})
    dp, pp, tp = (int(number(get(layout, k)) or 1) for k in ("data", "pipeline", "tensor"))
    mbs = number(get(plan, "micro_batch_size"))
    gbs = number(get(plan, "global_batch_size")) or (mbs * dp if mbs else None)
    workload = get(plan, "workload", {})
    wl_args = {k: v for k, v in workload.items() if k != "name"} \
        if isinstance(workload, dict) else get(plan, "workload_args", {})
    m = get(r, "metrics", {})
    tags = get(r, "tags", {})
    ablation = get(tags, "ablation", {})
    reason = get(r, "reason", "")
    row = {
        "trial_id": trial_id,
        "order": order,
        "study": str(get(r, "study", "")),
        "status": str(get(r, "status", "unknown")),
        "reason": str(reason),
        "reason_short": str(reason).strip().split("\n", 1)[0],
        "phase": str(get(tags, "phase", "")),
        "optuna_number": get(tags, "optuna_number"),
        "ablation_of": _str_or_none(get(ablation, "of")),
        "ablation_without": _str_or_none(get(ablation, "without")),
        "ablation_repeat": get(ablation, "repeat"),
        "duplicate_of": _str_or_none(get(tags, "duplicate_of")),  # a repeat, not re-measured
        # measured while other processes used the machine: why its figure is not its own
        "busy": busy_note(r) or "",
        "host_bound": host_bound_note(r) or "",
        "gpu_busy_pct": gpu_busy_pct(r),
        "workload": str(get(workload, "name", "") if isinstance(workload, dict) else workload),
        "workload_args": settings_text(wl_args),
        "layout": f"{dp}x{pp}x{tp}",
        "nodes": _nodes(get(tags, "cluster", {})),  # a Slurm job's nodes, "" for a local run
        "world_size": dp * pp * tp,
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
        "strategies": " + ".join(sorted(strategies)) or "none",
        "config": config_label(strategies),
        "samples_per_s": get(m, "samples_per_s"),
        "tokens_per_s": get(m, "tokens_per_s"),
        "step_time_median": get(m, "step_time_s.median"),
        "step_time_p10": get(m, "step_time_s.p10"),
        "step_time_p90": get(m, "step_time_s.p90"),
        "step_n": get(m, "step_time_s.n"),
        "mfu": get(m, "mfu"),
        "tflops_per_device": get(m, "tflops_per_device"),
        "peak_flops_source": str(get(m, "peak_flops_source", "")),
        "peak_memory_bytes": get(m, "peak_memory_bytes"),
        # judged against the budget: under the allocator's cap, what the trial needed
        "budget_memory_bytes": budget_peak_bytes(r),
        "predicted_memory_bytes": get(r, "predicted.peak_memory_bytes"),
        "predicted_step_time_s": get(r, "predicted.step_time_s"),
        "calibrated_memory_bytes": get(r, "predicted.calibrated_peak_memory_bytes"),
        "corrected_step_time_s": get(r, "predicted.corrected_step_time_s"),
        "corrected_from_trials": get(r, "predicted.corrected_from_trials"),
        "measured_for_estimate": _model_memory(m),
        "energy_j_per_sample": get(m, "energy_j_per_sample"),
        "loss_first": get(m, "loss.first"),
        "loss_last": get(m, "loss.last"),
        "device": str(get(r, "env.device_name", "") or get(r, "env.device", "")),
        "device_kind": str(get(r, "env.device", "")),
        "command": str(get(r, "command", "")),
        "started_at": str(get(r, "started_at", "")),
        "duration_s": get(r, "duration_s"),
    }
    for key in NUMERIC:
        row[key] = number(row[key])
    return row


def _str_or_none(x: Any) -> str | None:
    return None if x is None else str(x)


def short_labels(plans: dict[str, Any]) -> dict[str, str]:
    """Per trial id, its configuration without the settings that never vary in the study
    (a resolved plan fills in every default): "fused(attention=sdpa) + amp"."""
    seen: dict[tuple[str, str], set[str]] = {}
    per_trial = {tid: strategies_of(plan) for tid, plan in plans.items()}
    for strategies in per_trial.values():
        for name, settings in strategies.items():
            for key, value in settings.items():
                seen.setdefault((name, key), set()).add(_short(value))
    out = {}
    for tid, strategies in per_trial.items():
        varying = {name: {k: v for k, v in settings.items() if len(seen[(name, k)]) > 1}
                   for name, settings in strategies.items()}
        out[tid] = config_label(varying)
    return out


def _model_memory(m: dict) -> float | None:
    """The measured figure the estimator predicts: the allocator's peak on a GPU; on a CPU
    the process RSS above its start (the runtime and libraries are not the model's)."""
    peak, base = number(get(m, "peak_memory_bytes")), number(get(m, "memory.rss_base"))
    if peak is not None and base is not None and get(m, "memory.allocated") is None:
        return peak - base
    return peak
