"""The trial table, one row per trial, as a DataFrame, CSV or JSON (`harness report --csv`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from training_harness.records.pooled import config_key, pool
from training_harness.reports.load import Run

# (column in the export, column of the trial frame)
COLUMNS = [
    ("trial_id", "trial_id"), ("phase", "phase"), ("status", "status"), ("reason", "reason"),
    ("config", "config"), ("label", "label"), ("strategies", "strategies"), ("layout", "layout"),
    ("nodes", "nodes"), ("world_size", "world_size"), ("micro_batch_size", "micro_batch_size"),
    ("global_batch_size", "global_batch_size"), ("samples_per_s", "samples_per_s"),
    ("tokens_per_s", "tokens_per_s"), ("step_time_median_s", "step_time_median"),
    ("step_time_p10_s", "step_time_p10"), ("step_time_p90_s", "step_time_p90"),
    ("steps_measured", "step_n"), ("mfu", "mfu"), ("tflops_per_device", "tflops_per_device"),
    ("peak_memory_bytes", "peak_memory_bytes"), ("predicted_memory_bytes",
                                                 "predicted_memory_bytes"),
    ("predicted_step_time_s", "predicted_step_time_s"),
    ("energy_j_per_sample", "energy_j_per_sample"), ("gpu_busy_pct", "gpu_busy_pct"),
    ("loss_first", "loss_first"),
    ("loss_last", "loss_last"), ("duration_s", "duration_s"), ("started_at", "started_at"),
    ("optuna_number", "optuna_number"), ("ablation_of", "ablation_of"),
    ("ablation_without", "ablation_without"), ("ablation_repeat", "ablation_repeat"),
    ("duplicate_of", "duplicate_of"), ("busy", "busy"), ("host_bound", "host_bound"),
    ("workload", "workload"), ("workload_args", "workload_args"), ("device", "device"),
    ("command", "command"),
]

INTEGER = ("world_size", "micro_batch_size", "global_batch_size", "steps_measured",
           "peak_memory_bytes", "predicted_memory_bytes", "optuna_number", "ablation_repeat")


def trial_table(run: Run) -> pd.DataFrame:
    """Every trial with the columns above, plus its speedup over the study's fp32 baseline
    (this measurement over the baseline trial's; empty where the baseline did not
    finish), its configuration's pooled figure (the median of every quiet measurement of
    it, and their n: training_harness.records.pooled) and the estimator's memory error."""
    t = run.trials
    out = pd.DataFrame({name: t[src] for name, src in COLUMNS}).reset_index(drop=True)
    base = run.row(run.baseline_id)
    ok_base = base is not None and base["status"] == "ok" and base["samples_per_s"] > 0
    out.insert(out.columns.get_loc("samples_per_s") + 1, "speedup_vs_baseline",
               t["samples_per_s"].to_numpy() / base["samples_per_s"] if ok_base else math.nan)
    # the one figure of each trial's configuration: every quiet measurement of it pooled
    pools = pool(list(run.records.values()))
    mine = [pools.get(config_key((run.records.get(tid) or {}).get("plan"))) for tid in t.index]
    at = out.columns.get_loc("speedup_vs_baseline") + 1
    out.insert(at, "config_median_samples_per_s", [p.median if p else math.nan for p in mine])
    out.insert(at + 1, "config_n", [p.n if p else 0 for p in mine])
    out.insert(out.columns.get_loc("predicted_memory_bytes") + 1, "memory_error_pct",
               (t["predicted_memory_bytes"] / t["peak_memory_bytes"] - 1).to_numpy() * 100)
    out.insert(1, "is_best", (t["trial_id"] == run.best_id).to_numpy())
    out.insert(2, "is_baseline", (t["trial_id"] == run.baseline_id).to_numpy())
    out.insert(0, "study", run.name)
    for col in INTEGER:
        out[col] = pd.to_numeric(out[col], errors="coerce").round().astype("Int64")
    return out


def write_csv(run: Run, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    trial_table(run).to_csv(path, index=False)
    return path


def write_json(run: Run, path: str | Path) -> Path:
    """A JSON list of rows; missing values are null (never NaN, which is not JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = trial_table(run).astype(object)
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in table.where(table.notna(), None).to_dict(orient="records")]
    path.write_text(json.dumps(rows, indent=1, allow_nan=False, default=str) + "\n")
    return path
