"""The harness's real search (`harness tune`'s Tuner and GuidedSampler, over the estimator's
cost model) on a measured GPU table, and Optuna's samplers through the same Tuner:

    python -m tests.benchmarks.surface_replay.table_run \\
        tests/benchmarks/tables/gpt2-small-1gpu-table80_h200 --seeds 20 [--samplers tpe,botorch]

search_replay.py's table rows replay the search with its own ask-and-tell loop and no cost
model (its "harness" row is TPE after the estimator's first guesses). Here the table is a
surface (harness_run's): the study is checked and searched as `harness tune` does, in
world.h100_world faked as the table's GPU (H200), its helper's estimates made by the
estimator there, and each trial is played out on the virtual clock from its record in the
table: the steps at its measured step time (so a slow trial is cut early as the tuner cuts
it), the rest of its recorded seconds before them. The launcher's OVERHEAD_S is taken out
of each recorded duration, which already holds the real launcher's.

A configuration the table does not hold (32 of its study's 80: the recording ran out of
GPU time) answers as a failed trial, "not measured in the table", costing the launcher's
OVERHEAD_S and the helper's PREPARE_S: the Tuner learns it cannot have it. The cost to
0.97 of the table's best is measured as search_replay.py measures it (that page's rows
are the yardstick); a seed stops once there, or when the search ends by its own rules.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from tests.benchmarks.search_replay import TARGET, recorded
from tests.benchmarks.surface_replay.launcher import OVERHEAD_S
from training_harness.records.pooled import config_key


class TableSurface:
    """A measured table as a surface: each configuration's recorded figures, by its
    configuration key (steps, seed and budget aside). A strategy setting added to the
    harness since the table was recorded (fused's sdpa_backend and linear_cross_entropy,
    at their defaults: the table's study does not search them) is left out of the key."""

    def __init__(self, folder: Path):
        self.rows: dict[str, dict[str, Any]] = {}
        self.settings: dict[str, set[str]] = {}  # per strategy, the settings recorded
        records = [json.loads(line) for line in
                   (folder / "trials.jsonl").read_text().splitlines()]
        for r in records:
            for name, settings in r["plan"].get("strategies", {}).items():
                self.settings.setdefault(name, set()).update(settings)
        for r in records:
            if not recorded(r):
                continue
            m = r["metrics"]
            self.rows[self.key(r["plan"])] = {
                "status": r["status"], "reason": r.get("reason"),
                "samples_per_s": (m.get("samples_per_s") or 0.0) if r["status"] == "ok" else 0.0,
                "peak_memory_bytes": m.get("peak_memory_bytes"),
                "wall_s": max(0.0, (r.get("duration_s") or 0.0) - OVERHEAD_S),
                "cost_s": r.get("duration_s") or 0.0}

    def key(self, plan: dict[str, Any]) -> str:
        strategies = {name: {k: v for k, v in settings.items()
                             if k in self.settings.get(name, settings)}
                      for name, settings in plan.get("strategies", {}).items()}
        return config_key({**plan, "strategies": strategies})

    def __call__(self, plan: dict[str, Any], repeat: int = 0) -> dict[str, Any]:
        row = self.rows.get(self.key(plan))
        if row is None:
            return {"status": "failed", "reason": "not measured in the table", "wall_s": 0.0}
        return {k: v for k, v in row.items() if k != "cost_s"}

    def truth(self, plan: dict[str, Any]) -> dict[str, Any]:
        return self(plan)

    @property
    def best(self) -> float:
        return max(r["samples_per_s"] for r in self.rows.values())

    @property
    def total_s(self) -> float:
        """The whole table's recorded seconds: a seed that never reaches the goal counts
        this (as search_replay.py counts it)."""
        return sum(r["cost_s"] for r in self.rows.values())


def search_study(folder: Path, workdir: Path) -> Path:
    """The table's study as a user's study: sampler "auto" (the GuidedSampler), the
    default early stopping, a day's budget (the search ends by its own rules first)."""
    table = tomllib.loads((folder / "study.toml").read_text())
    table.update(sampler="auto", seed=0)
    table.pop("pruning", None)
    table["budget"] = {**table.get("budget", {}), "time": "1d", "n_trials": 0}
    path = workdir / "study.toml"
    path.write_text(tomli_w.dumps(table))
    return path


def run(folder: Path, seeds: int, samplers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every seed's cost to 0.97 of the table's best, by arm (the harness, then each of
    `samplers` in its place)."""
    from tests.benchmarks.surface_replay.harness_run import prepare_study, run_seed
    from tests.benchmarks.surface_replay.others import optuna_samplers
    from tests.benchmarks.surface_replay.world import H200, h100_world

    surface = TableSurface(folder)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    runs: dict[str, list[dict[str, Any]]] = {"harness": [], **{n: [] for n in samplers}}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="table-", dir=shm)))
        stack.enter_context(h100_world(1, H200))
        setup = prepare_study(search_study(folder, tmp), surface, tmp)
        setup.size = setup.checked.space.size()
        setup.best = surface.best
        setup.goal = TARGET * surface.best
        for seed in range(seeds):
            for arm, sampler in {"harness": None, **optuna_samplers(seed, samplers)}.items():
                cpu = time.process_time()
                r = run_seed(setup, seed, sampler=sampler)
                runs[arm].append({"seed": seed, "reached_s": r.reached_s,
                                  "launched": r.launched, "stopped": r.stopped,
                                  "cpu_s": time.process_time() - cpu})
    return {"table": str(folder), "best": surface.best, "measured": len(surface.rows),
            "total_s": surface.total_s,
            "configurations": setup.size, "seeds": seeds, "runs": runs}


def summary(result: dict[str, Any]) -> str:
    total = result["total_s"]
    lines = [f"{result['table']}: {result['measured']} of {result['configurations']} "
             f"configurations measured, best {result['best']:.1f} samples/s; cost to "
             f"{TARGET} of it over {result['seeds']} seeds (simulated seconds; a seed that "
             f"never gets there counts the whole table's {total:.0f} s):"]
    for arm, rs in result["runs"].items():
        costs = sorted(total if r["reached_s"] is None else r["reached_s"] for r in rs)
        p90 = costs[min(len(costs) - 1, int(0.9 * len(costs)))]
        missed = sum(r["reached_s"] is None for r in rs)
        lines.append(f"  {arm}: median {statistics.median(costs):.1f} s, p90 {p90:.1f} s, "
                     f"missed {missed} of {len(rs)}; trials launched median "
                     f"{statistics.median(r['launched'] for r in rs):g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--samplers", default="", help="comma-separated: tpe, gp, botorch")
    ap.add_argument("--json", type=Path, help="write every seed's run there")
    args = ap.parse_args(argv)
    result = run(args.table, args.seeds, tuple(s for s in args.samplers.split(",") if s))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
