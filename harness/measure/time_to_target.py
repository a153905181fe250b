"""Time to target for a measured configuration: steps to target x its step time.

The steps come from one run per seed to the target (training_harness.measure.convergence),
each looked up first in the cache by the plan's maths (training_harness.measure.target_cache)
and run only when absent. The step time is this trial's measured median. A
configuration is a success only when every seed reached the target; the record then
gives the median over seeds and its spread (min, max), and otherwise says which
seeds missed and the best loss each reached.
"""

from __future__ import annotations

import statistics
from typing import Any

from training_harness.core.target import maths_key, optimizer_name, precision, technique_name
from training_harness.measure import target_cache
from training_harness.measure.convergence import train_to_target
from training_harness.measure.prepare import Prepared


def seed_runs(prep: Prepared) -> list[dict[str, Any]]:
    """One run per seed of the plan's [target], from the cache where it holds one."""
    plan = prep.plan
    assert plan.target is not None
    table = plan.to_dict()
    runs = []
    for seed in plan.target.seeds:
        key = maths_key(table, seed, prep.device.type)
        run = target_cache.lookup(key)
        cached = run is not None
        if run is None:
            run = train_to_target(plan, prep.workload, prep.device, prep.runtime, seed)
            target_cache.store(key, run)
        runs.append({**run, "cached": cached})
    return runs


def summarize(runs: list[dict[str, Any]], step_time_s: float | None, target_loss: float,
              plan: dict[str, Any], length_times: dict[int, float] | None = None
              ) -> dict[str, Any]:
    """metrics.convergence, and the schema's steps_to_target / time_to_target_s.

    A seed's time is its steps to target x the measured step time; with a curriculum's
    `length_times` (training_harness.measure.length_times), the sum of each step's time at its
    length, and step_time_s is then that run's mean step (the window's is kept beside)."""
    reached = all(r["reached"] for r in runs)
    steps = [r["steps_to_target"] for r in runs if r["reached"]]
    times = [s * step_time_s for s in steps] if step_time_s else []
    extra: dict[str, Any] = {}
    if length_times and steps:
        from training_harness.measure import length_times as lt

        schedule = lt.schedule_of(plan, length_times)
        times = [lt.run_seconds(length_times, schedule.length, s) for s in steps]
        mid = statistics.median(steps)
        extra = {"window_step_time_s": step_time_s,
                 "step_time_by_length_s": {str(k): v for k, v in length_times.items()},
                 "time_rule": "each step at its length's measured step time (curriculum), "
                              "linear between the measured lengths"}
        step_time_s = lt.run_seconds(length_times, schedule.length, round(mid)) / round(mid)
    strategies = plan.get("strategies") or {}
    return {
        "target_loss": target_loss,
        "reached": reached,
        "seeds": [r["seed"] for r in runs],
        "optimizer": optimizer_name(strategies),
        "technique": technique_name(strategies),
        "precision": precision(strategies),
        "global_batch": plan.get("global_batch_size") or plan.get("micro_batch_size"),
        "step_time_s": step_time_s,
        "steps_to_target": statistics.median(steps) if reached else None,
        "samples_to_target": (statistics.median(r["samples_to_target"] for r in runs)
                              if reached else None),
        "time_to_target_s": statistics.median(times) if reached and times else None,
        "time_spread_s": [min(times), max(times)] if reached and times else None,
        "best_val_loss": min(r["best_val_loss"] for r in runs),
        "runs": runs,
        **extra,
    }


def add_time_to_target(prep: Prepared, metrics: dict[str, Any]) -> tuple[str, str | None]:
    """Fill metrics.convergence, steps_to_target and time_to_target_s; the trial's status
    and reason: a miss is "failed" (a loss that was not finite, "diverged")."""
    spec = prep.plan.target
    assert spec is not None
    plan = prep.plan.to_dict()
    step_s = (metrics.get("step_time_s") or {}).get("median")
    conv = summarize(seed_runs(prep), step_s, spec.loss, plan,
                     metrics.get("step_time_by_length_s"))
    metrics["convergence"] = conv
    metrics["steps_to_target"] = conv["steps_to_target"]
    metrics["time_to_target_s"] = conv["time_to_target_s"]
    if conv["reached"]:
        return "ok", None
    missed = [r for r in conv["runs"] if not r["reached"]]
    words = ", ".join(f"seed {r['seed']}: {r['stopped']} at {r['samples']} samples, best "
                      f"{r['best_val_loss']:.4g}" for r in missed)
    status = "diverged" if any(r["stopped"] == "diverged" for r in missed) else "failed"
    return status, (f"validation loss {spec.loss:g} not reached ({words}); "
                    "raise [target].max_samples, or change the lr or batch")
