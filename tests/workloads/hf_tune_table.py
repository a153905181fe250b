"""The docs/benchmarks table of an hf: study's run folder: the tuned best over the fp32
baseline, and the estimator's error on the study's measured trials.

    python tests/workloads/hf_tune_table.py runs/hf-llama-cpu

Errors are |predicted - measured| / measured over the ok trials (duplicates left out):
peak memory raw and as calibrated during the study, and the step time.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from training_harness.records.tags import tags_of


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]


def errors(recs: list[dict], predicted: str, measured) -> list[float]:
    out = []
    for r in recs:
        if r["status"] != "ok" or tags_of(r).get("duplicate_of") is not None:
            continue
        want, got = measured(r), (r.get("predicted") or {}).get(predicted)
        if want and got:
            out.append(abs(got - want) / want)
    return out


def describe(rec: dict) -> str:
    from training_harness.records.plan_text import describe_plan

    return describe_plan(rec["plan"]).replace(" | ", ", ")  # a table cell takes no "|"


def table(folder: Path) -> str:
    recs = records(folder)
    info = json.loads((folder / "study.json").read_text())
    best = next(r for r in recs if r["trial_id"] == info["best_trial_id"])
    base = next(r for r in recs if tags_of(r).get("phase") == "baseline")
    peak = lambda r: r["metrics"]["peak_memory_bytes"]  # noqa: E731
    step = lambda r: r["metrics"]["step_time_s"]["median"]  # noqa: E731
    mem_raw = errors(recs, "peak_memory_bytes", peak)
    mem_cal = errors(recs, "calibrated_peak_memory_bytes", peak)
    time_err = errors(recs, "step_time_s", step)
    ok = [r for r in recs if r["status"] == "ok"]
    speedup = best["metrics"]["samples_per_s"] / base["metrics"]["samples_per_s"]
    med = lambda xs: f"{statistics.median(xs):.1%}" if xs else "n/a"  # noqa: E731
    return "\n".join([
        "| | samples/s | configuration |",
        "| --- | --- | --- |",
        f"| fp32 baseline (trial {base['trial_id']}) | {base['metrics']['samples_per_s']:.2f} | "
        f"`{describe(base)}` |",
        f"| tuned best (trial {best['trial_id']}) | {best['metrics']['samples_per_s']:.2f} | "
        f"`{describe(best)}` |",
        "",
        f"Tuned over baseline: **{speedup:.2f}x** ({len(recs)} trials, {len(ok)} ok).",
        "",
        "| estimator, over the ok trials | median error | trials |",
        "| --- | --- | --- |",
        f"| peak memory, raw | {med(mem_raw)} | {len(mem_raw)} |",
        f"| peak memory, calibrated during the study | {med(mem_cal)} | {len(mem_cal)} |",
        f"| step time | {med(time_err)} | {len(time_err)} |",
    ])


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
