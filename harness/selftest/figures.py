"""The figures the selftest reports, from what its steps left behind: a junit file, a
bench record (result.json, schema 1) and a study's trials.jsonl and study.json.

Estimator errors are (predicted - measured) / measured: signed for one record, the
median of its absolute value over a study's measured trials.
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from training_harness.records.jsonl_lines import read_trials
from training_harness.records.predicates import gpu_busy_pct
from training_harness.records.values import get, number


def num(value: Any) -> float | None:
    """A finite number, or None: the records' one coercion, infinity left out (an error
    against an unbounded figure says nothing)."""
    return number(value, finite=True)


def signed_error(predicted: Any, measured: Any) -> float | None:
    p, m = num(predicted), num(measured)
    return (p - m) / m if p is not None and m else None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_jsonl(path: Path, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of a trials.jsonl (the run folder's one reader). Each line that is not
    one is named, never skipped silently: in `notes` for the caller to show, else as a
    warning line on stderr."""
    said: list[str] = []
    try:
        trials = read_trials(path)
    except OSError as e:
        said.append(f"{path}: not readable ({e}); no records from it")
        records: list[dict[str, Any]] = []
    else:
        said += trials.notes()
        records = trials.dicts()
    if notes is not None:
        notes += said
    else:
        for note in said:
            print(f"warning: {note}", file=sys.stderr, flush=True)
    return records


# --- pytest -------------------------------------------------------------------------

def _test_id(classname: str, name: str) -> str:
    """pytest's junit "tests.kernels.test_x" + "test_y[a]" -> "tests/kernels/test_x.py::test_y[a]"
    (a class, as "tests.test_x.TestZ", stays after the file)."""
    parts = classname.split(".") if classname else []
    if parts and parts[-1][:1].isupper():
        return "/".join(parts[:-1]) + f".py::{parts[-1]}::{name}"
    return ("/".join(parts) + ".py::" if parts else "") + name


def junit_counts(path: Path) -> dict[str, Any] | None:
    """{"passed", "failed", "errors", "skipped", "total", "failing": [test ids]}; None
    when the file is missing or unreadable (pytest never got to write it)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = Counter()
    failing = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            failing.append(_test_id(case.get("classname", ""), case.get("name", "?")))
    return {"passed": counts["passed"], "failed": counts["failed"], "errors": counts["errors"],
            "skipped": counts["skipped"], "total": sum(counts.values()), "failing": failing}


# --- one record ---------------------------------------------------------------------

def mfu_datasheet(record: dict[str, Any]) -> tuple[float | None, str | None]:
    """MFU against the datasheet peak and that peak's source (metrics.mfu divides by the
    peak `used`, which may be the measured one)."""
    m = record.get("metrics") or {}
    sheet = get(m, "peak_flops.datasheet") or {}
    tflops, flops = num(m.get("tflops_per_device")), num(sheet.get("flops"))
    if tflops is not None and flops:
        return tflops * 1e12 / flops, sheet.get("source")
    if get(m, "peak_flops.used") == "datasheet" or (m.get("mfu") is not None and not sheet):
        return num(m.get("mfu")), sheet.get("source") or m.get("peak_flops_source")
    return None, sheet.get("source")


def bench_figures(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of one record, flat: rates, spreads, MFU both ways, memory and step
    time measured against predicted."""
    m = record.get("metrics") or {}
    pred = record.get("predicted") or {}
    st = m.get("step_time_s") or {}
    mfu, sheet_source = mfu_datasheet(record)
    measured_peak = num(get(m, "peak_flops.measured.flops"))
    peak_mem = num(m.get("peak_memory_bytes"))
    pred_mem = num(pred.get("peak_memory_bytes"))
    step = num(st.get("median"))
    window = m.get("window") if isinstance(m.get("window"), dict) else None
    return {
        "status": record.get("status"), "reason": record.get("reason"),
        "samples_per_s": num(m.get("samples_per_s")), "tokens_per_s": num(m.get("tokens_per_s")),
        "step": {k: num(st.get(k)) for k in ("median", "p10", "p90", "stdev")}
        | {"n": st.get("n")},
        "window": window,
        "mfu_datasheet": mfu, "datasheet_source": sheet_source,
        "mfu_measured": num(m.get("mfu_measured_peak")), "measured_peak_flops": measured_peak,
        "peak_dtype": get(m, "peak_flops.dtype"),
        "memory": peak_mem, "allocated": num(get(m, "memory.allocated")),
        "reserved": num(get(m, "memory.reserved")),
        "predicted_memory": pred_mem, "memory_error": signed_error(pred_mem, peak_mem),
        "step_median": step, "predicted_step": num(pred.get("step_time_s")),
        "step_error": signed_error(pred.get("step_time_s"), step),
        "gpu_busy": gpu_busy_pct(record),
    }


def env_facts(record: dict[str, Any] | None) -> dict[str, Any]:
    env = (record or {}).get("env") or {}
    return {"device_name": env.get("device_name"), "driver": env.get("driver"),
            "torch": env.get("torch"), "cuda": env.get("cuda"),
            "triton": get(env, "packages.triton"), "gpus": len(env.get("gpus") or []) or None}


# --- a study ------------------------------------------------------------------------

def describe(plan: dict[str, Any]) -> str:
    """`d1p1t1, micro-batch 16: amp(dtype=bf16) + fused(attention=sdpa, ...)`."""
    lay = plan.get("layout") or {}
    strategies = plan.get("strategies") or {}
    parts = []
    for name in sorted(strategies):
        settings = strategies[name] or {}
        text = ", ".join(f"{k}={v}" for k, v in settings.items())
        parts.append(f"{name}({text})" if text else name)
    layout = f"d{lay.get('data', 1)}p{lay.get('pipeline', 1)}t{lay.get('tensor', 1)}"
    return (f"{layout}, micro-batch {plan.get('micro_batch_size')}: "
            f"{' + '.join(parts) or 'fp32, no strategies'}")


def _median_abs(values: list[float | None]) -> tuple[float | None, int]:
    seen = [abs(v) for v in values if v is not None]
    return (statistics.median(seen) if seen else None), len(seen)


def tune_figures(trials: list[dict[str, Any]], info: dict[str, Any] | None) -> dict[str, Any]:
    """Trials by status, the best measured trial against the fp32 baseline, its MFU, and
    the estimator's error over the measured trials."""
    info = info or {}
    ok = [t for t in trials if t.get("status") == "ok" and num(get(t, "metrics.samples_per_s"))]
    best_id = info.get("best_trial_id")
    best = next((t for t in ok if best_id is not None and t.get("trial_id") == best_id), None)
    if best is None and ok:  # the study did not say: the fastest, repeats of the ablation
        first = [t for t in ok if get(t, "tags.phase") != "ablation"] or ok  # only if alone
        best = max(first, key=lambda t: num(get(t, "metrics.samples_per_s")) or 0.0)
    baseline = next((t for t in trials if get(t, "tags.phase") == "baseline"), None)
    base_rate = (num(get(baseline, "metrics.samples_per_s"))
                 if baseline and baseline.get("status") == "ok" else None)
    best_rate = num(get(best, "metrics.samples_per_s")) if best else None
    # a configuration proposed again carries the first run's figures: count it once
    measured = [t for t in ok if not get(t, "tags.duplicate_of")]
    mem_errors, raw_errors, step_errors, model_errors = [], [], [], []
    for t in measured:
        pred = t.get("predicted") or {}
        mem = get(t, "metrics.peak_memory_bytes")
        used = pred.get("calibrated_peak_memory_bytes", pred.get("peak_memory_bytes"))
        mem_errors.append(signed_error(used, mem))
        raw_errors.append(signed_error(pred.get("peak_memory_bytes"), mem))
        step = get(t, "metrics.step_time_s.median")
        step_errors.append(signed_error(pred.get("step_time_s"), step))
        if pred.get("corrected_from_trials"):  # the step-time model, after earlier trials
            model_errors.append(signed_error(pred.get("corrected_step_time_s"), step))
    mem_err, mem_n = _median_abs(mem_errors)
    raw_err, _ = _median_abs(raw_errors)
    step_err, step_n = _median_abs(step_errors)
    model_err, model_n = _median_abs(model_errors)
    best_figures = bench_figures(best) if best else None
    return {
        "n": len(trials),
        "by_status": dict(sorted(Counter(str(t.get("status")) for t in trials).items())),
        "by_phase": dict(sorted(Counter(str(get(t, "tags.phase", "search"))
                                        for t in trials).items())),
        "best": None if best is None else {
            "trial_id": best.get("trial_id"), "phase": get(best, "tags.phase"),
            "samples_per_s": best_rate, "config": describe(best.get("plan") or {}),
            "figures": best_figures},
        "baseline": None if baseline is None else {
            "trial_id": baseline.get("trial_id"), "status": baseline.get("status"),
            "reason": baseline.get("reason"), "samples_per_s": base_rate,
            "config": describe(baseline.get("plan") or {})},
        "ratio": best_rate / base_rate if best_rate and base_rate else None,
        "memory_error": mem_err, "memory_error_raw": raw_err, "memory_n": mem_n,
        "step_error": step_err, "step_n": step_n,
        "model_error": model_err, "model_n": model_n,
        "peaks": info.get("peaks") or None,
        "over_budget": _over_budget(measured, num(info.get("memory_budget_bytes"))),
        "memory_budget_bytes": num(info.get("memory_budget_bytes")),
        "stopped_because": info.get("stopped_because"),
    }


def _over_budget(ok: list[dict[str, Any]], budget: float | None) -> list[dict[str, Any]]:
    """Trials that ran but needed more than the memory budget (never the study's best):
    under the allocator's cap, its reserved peak plus the context, else the device's peak
    (training_harness.core.memory_need.budget_peak_bytes)."""
    from training_harness.core.memory_need import budget_peak_bytes

    if not budget:
        return []
    return [{"trial_id": t.get("trial_id"), "samples_per_s": num(get(t, "metrics.samples_per_s")),
             "peak": budget_peak_bytes(t)}
            for t in ok if (budget_peak_bytes(t) or 0) > budget]
