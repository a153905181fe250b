"""`search_replay.py --surface package.module:function --study studies/X.toml`: the three
strategies replayed `seeds` times against the surface, and their table (markdown)."""

from __future__ import annotations

import importlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.benchmarks.surface_replay.harness_run import HOUR, Run, prepare_study, run_seed
from tests.benchmarks.surface_replay.launcher import OVERHEAD_S
from tests.benchmarks.surface_replay.others import (
    SAMPLE,
    enumerate_space,
    run_estimator,
    run_random,
)
from tests.benchmarks.surface_replay.world import PREPARE_S, h100_world
from training_harness.core.units import format_bytes
from training_harness.study.study_file import Study

TARGET = 0.97
STRATEGIES = ("harness", "random", "estimator")


def load_surface(spec: str) -> Any:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--surface {spec!r}: write package.module:function")
    fn = getattr(importlib.import_module(module), name)
    if not hasattr(fn, "truth"):  # the noise-free figures: repeat 0 where none are given
        fn.truth = lambda plan, fn=fn: fn(plan, 0)
    return fn


def replay(surface_spec: str, study_file: Path, seeds: int, say=print,
           strategies: tuple[str, ...] = STRATEGIES,
           budget_s: float | None = None) -> dict[str, Any]:
    """Every strategy's runs, and what the table needs. With `budget_s`, the harness's
    whole study within that budget (run_seed), and no other strategy."""
    if budget_s is not None:
        strategies = ("harness",)
    surface = load_surface(surface_spec)
    gpus = max(Study.from_toml(study_file).layout.world_sizes)
    t0 = time.monotonic()
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="surface-replay-", dir=shm) as tmp, h100_world(gpus):
        setup = prepare_study(study_file, surface, Path(tmp))
        space = enumerate_space(setup.checked.space, surface.truth, setup.checked.budget_bytes)
        setup.size, setup.best, setup.goal = len(space.plans), space.best, TARGET * space.best
        say(f"{study_file}: {setup.size} configurations, best {space.best:.4g} samples/s "
            f"({time.monotonic() - t0:.0f} s)")
        runs: dict[str, list[Run]] = {name: [] for name in strategies}
        for seed in range(seeds):
            t = time.monotonic()
            if "harness" in runs:
                runs["harness"].append(run_seed(setup, seed, budget_s))
            if "random" in runs:
                runs["random"].append(run_random(setup, space, seed))
            if "estimator" in runs:
                runs["estimator"].append(run_estimator(setup, space, seed))
            last = {k: v[-1].reached_s for k, v in runs.items()}
            say(f"seed {seed}: " + ", ".join(
                f"{k} {'-' if s is None else f'{s / HOUR:.2f} h'}" for k, s in last.items())
                + f" ({time.monotonic() - t:.1f} s)")
    return {"runs": runs, "space": space, "setup": setup, "wall_s": time.monotonic() - t0,
            "budget_s": budget_s or setup.checked.study.budget.time_s,
            "whole_study": budget_s is not None,
            "budget_bytes": setup.checked.budget_bytes}


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _hours(seconds: float) -> str:
    return "missed" if seconds == float("inf") else f"{seconds / HOUR:.2f}"


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    best = result["space"].best
    for name, runs in result["runs"].items():
        costs = [r.reached_s if r.reached_s is not None else float("inf") for r in runs]
        row = {"strategy": name, "median": statistics.median(costs),
               "p90": _quantile(costs, 0.9), "missed": sum(c == float("inf") for c in costs),
               "runs": len(runs), "launched": statistics.median(r.launched for r in runs)}
        if name in ("harness", "random"):
            row["share_1h"] = statistics.median(r.best_at(HOUR) / best for r in runs)
        if name == "harness":
            named = [r.named for r in runs if r.named]
            row["named_share"] = statistics.median(n["share"] for n in named) if named else 0.0
            row["over_measured"] = sum(bool(n["over_measured"]) for n in named)
            row["over_true"] = sum(bool(n["over_true"]) for n in named)
            row["no_best"] = len(runs) - len(named)
            row["stopped"] = Counter(r.stopped.split(":")[0] for r in runs)
        rows.append(row)
    return rows


def table(result: dict[str, Any], surface_spec: str, study_file: Path) -> list[str]:
    space, rows = result["space"], summary(result)
    n = len(space.plans)
    near = sum(r >= TARGET * space.best for r in space.rates)
    lines = [f"## {surface_spec} on {study_file}", "",
             f"{n:,} configurations ({', '.join(f'{v:,} {k}' for k, v in space.statuses.items())}"
             f" noise-free); best within the memory budget ({format_bytes(result['budget_bytes'])})"
             f" {space.best:.4g} samples/s ({space.unconstrained_best:.4g} without the budget); "
             f"{near} configuration(s) within {TARGET} of it. Study budget "
             f"{result['budget_s'] / HOUR:g} h.", "",
             "| strategy | median cost to 0.97 (h) | p90 (h) | missed | best-so-far share at 1 h "
             "(median) | trials launched (median) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        share = f"{r['share_1h']:.3f}" if "share_1h" in r else "-"
        lines.append(f"| {r['strategy']} | {_hours(r['median'])} | {_hours(r['p90'])} | "
                     f"{r['missed']} of {r['runs']} | {share} | {r['launched']:g} |")
    h = next((r for r in rows if r["strategy"] == "harness"), None)
    rnd = next((r for r in rows if r["strategy"] == "random"), None)
    if h is not None:
        lines += ["", f"Harness: the named best (StudyTrials.best_trial() when the search "
                      f"stopped) is {h['named_share']:.3f} of the best (median); over the "
                      f"memory budget as measured in {h['over_measured']} run(s), by its "
                      f"noise-free peak in {h['over_true']}; no best in {h['no_best']}. "
                      "Stopped by: " + ", ".join(f"{k} ({v})" for k, v in h["stopped"].items())
                      + "."]
        if rnd is not None and rnd["median"] not in (0, float("inf")):
            lines.append(f"Harness / random median cost: {h['median'] / rnd['median']:.2f} "
                         "(issue 24 asks for at most 0.33).")
    return lines


def budget_table(result: dict[str, Any], surface_spec: str, study_file: Path) -> list[str]:
    """The whole studies within a budget: the best each named, against the surface's."""
    space, runs = result["space"], result["runs"]["harness"]
    named = [r.named for r in runs if r.named]
    shares = sorted(n["share"] for n in named) + [0.0] * (len(runs) - len(named))
    at_least = sum(s >= 0.95 for s in shares)
    return [
        f"## {surface_spec} on {study_file}: whole studies of {result['budget_s'] / HOUR:g} h",
        "", f"{len(space.plans):,} configurations; best within the memory budget "
            f"({format_bytes(result['budget_bytes'])}) {space.best:.4g} samples/s.", "",
        "| seeds | named best / surface's best: median | p10 | min | runs >= 0.95 | "
        "over the budget (measured / noise-free) | no best | trials launched (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {len(runs)} | {statistics.median(shares):.3f} | {_quantile(shares, 0.1):.3f} | "
        f"{min(shares):.3f} | {at_least} of {len(runs)} | "
        f"{sum(bool(n['over_measured']) for n in named)} / "
        f"{sum(bool(n['over_true']) for n in named)} | {len(runs) - len(named)} | "
        f"{statistics.median(r.launched for r in runs):g} |", "",
        "Each study ran as `harness tune --budget` runs it: the search to its reserve, then "
        "the final phases (confirmation rounds, ablation); the named best is "
        "StudyTrials.best_trial() after them, its noise-free samples/s over the surface's "
        "best. Search stopped by: " + ", ".join(
            f"{k} ({v})" for k, v in Counter(r.stopped.split(':')[0] for r in runs).items())
        + f"; simulated hours used, median "
          f"{statistics.median(r.elapsed_s for r in runs) / HOUR:.2f}."]


def main(surface_spec: str, study_file: Path, seeds: int, doc: Path | None,
         budget_s: float | None = None) -> None:
    load = os.getloadavg()
    result = replay(surface_spec, study_file, seeds,
                    say=lambda text: print(text, file=sys.stderr, flush=True),
                    budget_s=budget_s)
    after = os.getloadavg()
    shown = budget_table if budget_s is not None else table
    lines = shown(result, surface_spec, study_file) + [
        "", f"Replay wall time {result['wall_s']:.0f} s on {os.cpu_count()} CPUs; load average "
            f"{load[0]:.2f} before, {after[0]:.2f} after. Each trial costs the surface's wall_s "
            f"+ {OVERHEAD_S:g} s (launcher) + {PREPARE_S:g} s per helper question; the "
            f"estimator's order ranks a seeded sample of {SAMPLE} configurations.", ""]
    text = "\n".join(lines)
    print(text)
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        with open(doc, "a") as f:
            f.write(text + "\n")
