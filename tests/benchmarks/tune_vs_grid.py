"""The tuner against the exhaustive grid over the same space, and the estimator's memory error.

    python tests/benchmarks/tune_vs_grid.py studies/quickstart.toml --budget 3m \
        --out runs/bench-tune-vs-grid --rounds 3 --doc docs/benchmarks/

1. `harness tune STUDY --budget B`: the study as a user runs it.
2. The same space as a grid (sampler = "grid", no early stopping, no ablation,
   a budget large enough for every configuration): each configuration once.
3. The two bests measured again side by side, rounds interleaved (tuner's best,
   grid's best, tuner's, grid's, ...) with `harness bench`, so the ratio is not
   a matter of when each happened to run on a shared machine.
4. The estimator's error on peak memory over the tuned study's measured trials:
   |predicted - measured| / measured, raw and as calibrated during the study
   (the calibration of the trials before each one).

Prints a markdown report; with --doc, writes it as
docs/benchmarks/tuner_<study>_<device>_<date>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
import tomllib
from datetime import date
from pathlib import Path

import tomli_w

from training_harness.records.tags import tags_of


def run(cmd: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}\n{proc.stdout[-3000:]}")
    return time.monotonic() - t0


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]


def best_of(folder: Path) -> tuple[dict, float]:
    info = json.loads((folder / "study.json").read_text())
    rec = next(r for r in records(folder) if r["trial_id"] == info["best_trial_id"])
    return rec, rec["metrics"]["samples_per_s"]


def memory_errors(recs: list[dict]) -> tuple[list[float], list[float]]:
    raw, calibrated = [], []
    for r in recs:
        if r["status"] != "ok" or tags_of(r).get("duplicate_of") is not None:
            continue
        measured, p = r["metrics"]["peak_memory_bytes"], r.get("predicted") or {}
        if measured and p.get("peak_memory_bytes"):
            raw.append(abs(p["peak_memory_bytes"] - measured) / measured)
        if measured and p.get("calibrated_peak_memory_bytes"):
            calibrated.append(abs(p["calibrated_peak_memory_bytes"] - measured) / measured)
    return raw, calibrated


def rebench(plans: dict[str, Path], rounds: int, out: Path) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in plans}
    for i in range(rounds):
        for name, plan in plans.items():
            folder = out / f"{name}-{i}"
            run([sys.executable, "-m", "training_harness", "bench", str(plan), "--out",
                 str(folder)], 900)
            rec = json.loads((folder / "result.json").read_text())
            rates[name].append(rec["metrics"]["samples_per_s"])
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("study")
    ap.add_argument("--budget", default="3m")
    ap.add_argument("--out", default="runs/bench-tune-vs-grid")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--doc", help="folder to write the markdown report into")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = tomllib.loads(Path(args.study).read_text())
    name = table["name"]

    tune_dir = out / "tune"
    tune_s = run([sys.executable, "-m", "training_harness", "tune", args.study, "--budget",
                  args.budget,
                  "--out", str(tune_dir), "--quiet"], 24 * 3600)

    grid = dict(table, sampler="grid", name=f"{name}-grid")
    grid["budget"] = {**table.get("budget", {}), "time": "12h", "ablation_repeats": 0,
                      "ablation_share": 0.0, "n_trials": 0}
    grid["pruning"] = {"slower_than": 0}
    grid_file = out / "grid.toml"
    grid_file.write_text(tomli_w.dumps(grid))
    grid_dir = out / "grid"
    grid_s = run([sys.executable, "-m", "training_harness", "tune", str(grid_file), "--out",
                  str(grid_dir), "--quiet"], 24 * 3600)

    tune_best, tune_rate = best_of(tune_dir)
    grid_best, grid_rate = best_of(grid_dir)
    again = rebench({"tuner": tune_dir / "best.toml", "grid": grid_dir / "best.toml"},
                    args.rounds, out / "rebench")
    med = {k: statistics.median(v) for k, v in again.items()}
    tune_recs = records(tune_dir)
    raw, cal = memory_errors(tune_recs)
    n_grid = sum(1 for r in records(grid_dir) if r["status"] == "ok")
    tune_ok = sum(1 for r in tune_recs if r["status"] == "ok")
    from training_harness.measure.env import capture_env

    env = capture_env(__import__("torch").device("cpu"))
    device = env.get("device_name") or platform.processor()

    lines = [
        f"# The tuner against the exhaustive grid: {name}, {date.today()}",
        "",
        f"Device: {device} ({env.get('cpu_count') or '?'} cores), torch {env.get('torch')}, "
        f"harness {env.get('harness')}. A shared machine: other processes ran.",
        "",
        "Command: `python tests/benchmarks/tune_vs_grid.py "
        f"{args.study} --budget {args.budget} --rounds {args.rounds}`",
        "",
        "| | tuner (`harness tune --budget " + args.budget + "`) | exhaustive grid |",
        "| --- | --- | --- |",
        f"| wall clock | {tune_s:.0f} s | {grid_s:.0f} s |",
        f"| trials | {len(tune_recs)} ({tune_ok} ok) | {len(records(grid_dir))} "
        f"({n_grid} ok) |",
        f"| best, as measured in the study | {tune_rate:.2f} samples/s (trial "
        f"{tune_best['trial_id']}) | {grid_rate:.2f} samples/s (trial {grid_best['trial_id']}) |",
        f"| best, measured again ({args.rounds} interleaved rounds: median [min, max]) | "
        f"{med['tuner']:.2f} [{min(again['tuner']):.2f}, {max(again['tuner']):.2f}] | "
        f"{med['grid']:.2f} [{min(again['grid']):.2f}, {max(again['grid']):.2f}] |",
        "",
        f"Throughput ratio, tuner's best / grid's best, measured again: "
        f"**{med['tuner'] / med['grid']:.3f}** (in the studies: {tune_rate / grid_rate:.3f}).",
        "",
        "The tuner's best: `" + _describe(tune_best) + "`; the grid's: `"
        + _describe(grid_best) + "`.",
        "",
        f"Estimator, peak memory over the tuned study's {len(raw)} measured trials "
        f"(|predicted - measured| / measured): median **{statistics.median(raw):.1%}** raw, "
        f"**{statistics.median(cal):.1%}** calibrated during the study. On a CPU the "
        "measured peak is the process's RSS, which holds the Python and torch runtime "
        "beside the tensors the estimator counts; the calibration adds that runtime and "
        "the measured/predicted ratio of what is above it.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.doc:
        path = Path(args.doc) / f"tuner_{name}_cpu_{date.today()}.md"
        path.write_text(report)
        print(f"wrote {path}")


def _describe(rec: dict) -> str:
    from training_harness.records.plan_text import describe_plan

    return describe_plan(rec["plan"])


if __name__ == "__main__":
    main()
