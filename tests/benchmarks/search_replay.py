"""Search strategies replayed on a recorded table: how much measuring each needs to find a best.

    python tests/benchmarks/search_replay.py --out runs/replay --seeds 50 \
        --doc docs/benchmarks/

With `--surface package.module:function --study studies/X.toml` the replay is against a
simulated response surface instead (tests/benchmarks/surface_replay: the harness's own
Tuner on a virtual clock, random search, the estimator's order), e.g.

    python tests/benchmarks/search_replay.py --seeds 50 --study studies/gpt-1b-8gpu.toml \
        --surface tests.benchmarks.surfaces.h100:gpt_1b_8gpu

With `--family SPACE` (gpt-1b-8gpu or gpt2-small-1gpu) the same three strategies run on
every surface of the family (tests/benchmarks/surfaces/family.py), one JSON line per
surface appended to --jsonl as each finishes (a surface already there is skipped: the run
resumes), then the family's tables; `--family-report FILE.jsonl ...` prints the tables of
lines written before (surface_replay/family_report.py), e.g.

    python tests/benchmarks/search_replay.py --family gpt-1b-8gpu --seeds 10 \
        --jsonl runs/family/gpt-1b-8gpu.jsonl [--surfaces base,comm-slow] [--jobs 2] \
        [--samplers tpe,gp,botorch]

(`--samplers`: Optuna's samplers as well, each through the same real Tuner with only the
sampler swapped: surface_replay/harness_run.sampler_swapped.)

1. Record: every configuration of a study's space measured once, as a grid study
   (no early stopping, no confirmation, no ablation): the quickstart space, and a
   2-process space on this CPU (studies written below). `--table FOLDER` reuses a
   recorded study instead.
2. Replay, `--seeds` times each, against that table (a configuration's figure and
   its cost are its record's samples/s and wall-clock seconds):
     harness    the harness's own proposal loop: its sampler (training_harness.tune.search.sampling:
                TPE as the study configures it), the references first (the fp32
                baseline, the known-good configuration), then the estimator's five
                first tier of a sample (training_harness.tune.search.first_guesses), a repeat
                proposal costs
                nothing and queues the unmeasured configuration nearest the best,
                and a trial slower than 1/slower_than of the best so far costs only
                its warm-up and min_steps (as early stopping cuts it)
     random     configurations in a random order, each once
     grid       Optuna's GridSampler over the same space
     estimator  the estimator's order: fastest predicted step time per sample first,
                its ties in a random order
     estimator, references first
                the same order on the harness's trial path: the references first,
                early stopping
   For each: the cost (measured seconds spent) to first reach 0.97 of the table's
   best, median and 90th percentile over seeds, and the median curve of the best
   found against cost (written as CSV beside the markdown).

The replay's truth is one measurement per configuration, noise included: it judges
the order of the search, not the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

# Run as a script: this tree's training_harness and tests.benchmarks.*, before any import
# of them (an editable install of another checkout would otherwise answer: two trees'
# replays then both measured the installed one).
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.benchmarks.this_tree import use_this_tree  # noqa: E402

use_this_tree()

import optuna  # noqa: E402
import tomli_w  # noqa: E402

from training_harness.records.predicates import finished  # noqa: E402
from training_harness.records.tags import tags_of  # noqa: E402

TARGET = 0.97
DISTRIBUTED = {
    "name": "replay-2proc", "device": "cpu", "global_batch_size": 16,
    "micro_batch_sizes": [4, 8], "warmup_steps": 2, "steps": 6,
    "workload": {"name": "gpt", "layers": 2, "heads": 4, "hidden": 128, "seq_len": 128,
                 "vocab": 2048},
    "layout": {"world_sizes": [2]},
    "strategies": {"zero": {"search": ["stage"], "values": {"stage": [1, 2, 3]}},
                   "amp": {"search": ["dtype"], "values": {"dtype": ["bf16"]}},
                   "fused": {"search": ["optimizer"], "values": {"optimizer": ["foreach"]}}},
}


def record(study_file: Path, out: Path) -> None:
    """Every configuration once: the study as a grid, nothing cut short."""
    table = __import__("tomllib").loads(study_file.read_text())
    table.update(sampler="grid", seed=0)
    table.setdefault("pruning", {})["slower_than"] = 0
    table["budget"] = {**table.get("budget", {}), "time": "60m", "ablation_repeats": 0,
                       "confirm_repeats": 0, "n_trials": 0}
    grid = out.with_suffix(".toml")
    grid.write_text(tomli_w.dumps(table))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "training_harness", "tune", str(grid), "--out", str(out),
                    "--quiet"], cwd=ROOT, check=True, timeout=3600)
    print(f"recorded {out} in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def recorded(r: dict) -> bool:
    """Whether a table's record measured its configuration: not a duplicate, and not
    skipped for time, cut off at the deadline or left by a dead worker (a table recorded
    over several sessions holds such records; a later session measures them:
    training_harness.tune.recovery.grid_rest)."""
    return ("duplicate_of" not in tags_of(r) and finished(r)
            and tags_of(r).get("phase") in ("baseline", "known-good", "search"))


def load_table(folder: Path) -> tuple[dict, list[dict], Any]:
    """(configuration key -> rate, cost, predicted rate, phase), the study, its space."""
    from training_harness.study.search_space import SearchSpace
    from training_harness.study.study_file import Study

    study = Study.from_toml(folder / "study.toml")
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(folder / "optuna.journal")))
    trials = optuna.load_study(study_name=study.name, storage=storage).get_trials()
    by_number = {t.number: t for t in trials}
    rows = {}
    for line in (folder / "trials.jsonl").read_text().splitlines():
        r = json.loads(line)
        t = by_number.get(tags_of(r).get("optuna_number"))
        if t is None or not recorded(r):
            continue
        m, p = r["metrics"], r.get("predicted") or {}
        batch = r["plan"]["global_batch_size"]
        rows[key(t.params)] = {
            "params": t.params, "phase": r["tags"]["phase"],
            "rate": (m.get("samples_per_s") or 0.0) if r["status"] == "ok" else 0.0,
            "cost": r.get("duration_s") or 0.0, "steps": r["plan"]["steps"],
            "warmup": r["plan"]["warmup_steps"],
            "predicted": batch / p["step_time_s"] if p.get("step_time_s") else 0.0}
    if study.device != "cuda":
        return rows, study, SearchSpace.of(study, study.device)
    # a GPU table (harness selftest --gpu --only table), replayed here on a CPU: the
    # space as the GPU resolved it, with the device faked as the surfaces fake it (the
    # table's own GPU where the simulation knows it)
    from tests.benchmarks.surface_replay.world import H100, H200, h100_world

    first = json.loads((folder / "trials.jsonl").read_text().splitlines()[0])
    gpu = H200 if first["env"].get("device_name") == H200.name else H100
    with h100_world(study.layout.world_sizes[0], gpu):
        return rows, study, SearchSpace.of(study, study.device)


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


class Replay:
    """One search's spending: cost so far, best so far, and the curve of both."""

    def __init__(self, table: dict, goal: float):
        self.table, self.goal = table, goal
        self.cost, self.best, self.curve, self.reached = 0.0, 0.0, [(0.0, 0.0)], None

    def measure(self, k: str, fraction: float = 1.0) -> float:
        row = self.table[k]
        self.cost += row["cost"] * fraction
        if fraction == 1.0 and row["rate"] > self.best:
            self.best = row["rate"]
            self.curve.append((self.cost, self.best))
            if self.reached is None and self.best >= self.goal:
                self.reached = self.cost
        return row["rate"]


def replay_order(table: dict, order: list[str], goal: float) -> Replay:
    r = Replay(table, goal)
    for k in order:
        if r.reached is not None:
            break
        r.measure(k)
    return r


def replay_sampler(table: dict, study, space, sampler, goal: float, harness: bool,
                   guesses: bool = True, queue: list[str] | None = None) -> Replay:
    """Ask/tell with `sampler`; with `harness`, the tuner's trial path (the references
    first, a repeat costs nothing, early stopping of a slow trial) and, with `guesses`, the
    harness's own search around the sampler (the estimator's first guesses, the nearest
    unmeasured configuration after a repeat). Optuna's samplers get the path, not the
    guesses: they are what the harness's search adds. `queue`: configurations (keys) asked
    in this order after the references (the estimator's order on the same path)."""
    r = Replay(table, goal)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna_study = optuna.create_study(sampler=sampler, direction="maximize")
    if harness:
        for phase in ("baseline", "known-good"):
            ref = next((row for row in table.values() if row["phase"] == phase), None)
            if ref is not None:
                optuna_study.enqueue_trial(ref["params"])
    for k in queue or []:
        optuna_study.enqueue_trial(table[k]["params"])
    if harness and guesses:
        # the estimator's guesses (training_harness.tune.search.first_guesses), from the recorded
        # predictions
        from training_harness.tune.model.estimator_model import SAMPLE
        from training_harness.tune.search.first_guesses import first_tier

        refs = [row["params"] for row in table.values() if row["phase"] != "search"]
        pool = [row["params"] for row in table.values() if row["params"] not in refs]
        if len(pool) > SAMPLE:  # all of a small table, else a seeded sample of SAMPLE
            pool = random.Random(study.seed).sample(pool, SAMPLE)
        scored = [(table[key(p)]["predicted"], p) for p in pool if table[key(p)]["predicted"]]
        for params in first_tier(scored, len(table), study.seed):
            optuna_study.enqueue_trial(params)
    measured: set[str] = set()
    slower, min_steps = study.pruning.slower_than, study.pruning.min_steps
    stale = 0
    while r.reached is None and len(measured) < len(table) and stale < 200:
        trial = optuna_study.ask()
        space.suggest(trial)
        k = key(trial.params)
        if k not in table:  # not recorded (yet: a table still being recorded): not measurable
            optuna_study.tell(trial, state=optuna.trial.TrialState.FAIL)
            stale += 1
            continue
        if k in measured:
            optuna_study.tell(trial, table[k]["rate"])
            stale += 1
            if harness and guesses:
                _enqueue_nearest(optuna_study, table, measured, r.best)
            continue
        stale = 0
        measured.add(k)
        row = table[k]
        if harness and slower and r.best and row["rate"] * slower < r.best:
            r.measure(k, (row["warmup"] + min_steps) / (row["warmup"] + row["steps"]))
            optuna_study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        optuna_study.tell(trial, r.measure(k))
    return r


def _enqueue_nearest(optuna_study, table, measured, best_rate) -> None:
    best = next((row for row in table.values() if row["rate"] == best_rate), None)
    fresh = [row["params"] for k, row in table.items() if k not in measured]
    if best is None or not fresh:
        return
    def distance(p):
        return sum(p.get(n) != best["params"].get(n) for n in p.keys() | best["params"].keys())
    optuna_study.enqueue_trial(min(fresh, key=lambda p: (distance(p), key(p))))


def evaluate(folder: Path, seeds: int) -> tuple[list[dict], dict[str, list], dict, float, float,
                                               int]:
    """The strategies' costs, their curves, the table, its total cost, its best, and the
    size of its study's space (a table still being recorded holds fewer: the searches
    then choose among the configurations it holds)."""
    from tests.benchmarks.surface_replay.others import optuna_samplers
    from training_harness.tune.search.sampling import make_sampler

    table, study, space = load_table(folder)
    best = max(row["rate"] for row in table.values())
    goal = TARGET * best
    grid_space = {}
    for params in space.enumerate():
        for name, value in params.items():
            grid_space.setdefault(name, [])
            if value not in grid_space[name]:
                grid_space[name].append(value)
    runs: dict[str, list[Replay]] = {"harness": [], **{n: [] for n in optuna_samplers(0)},
                                     "random": [], "grid": [], "estimator": [],
                                     "estimator, references first": []}
    # The table was recorded as a grid without early stopping: the replay searches as a
    # study does by default (its sampler "auto", the default early stopping).
    study.sampler, study.pruning = "auto", type(study.pruning)()
    for seed in range(seeds):
        study.seed = seed
        runs["harness"].append(replay_sampler(table, study, space,
                                              make_sampler(study, len(table)), goal,
                                              harness=True))
        # Optuna's own samplers through the same path: only the sampler swapped
        for name, sampler in optuna_samplers(seed).items():
            runs[name].append(replay_sampler(table, study, space, sampler, goal, harness=True,
                                             guesses=False))
        order = list(table)
        random.Random(seed).shuffle(order)
        runs["random"].append(replay_order(table, order, goal))
        runs["grid"].append(_grid(table, space, grid_space, seed, goal))
        # the estimator's order; its ties (configurations it cannot tell apart) shuffled
        order = list(table)
        random.Random(seed).shuffle(order)
        by_prediction = sorted(order, key=lambda k: -table[k]["predicted"])
        runs["estimator"].append(replay_order(table, by_prediction, goal))
        # the same order on the harness's trial path: the references first (every study
        # measures its fp32 baseline, the speedups' denominator), early stopping
        runs["estimator, references first"].append(replay_sampler(
            table, study, space, optuna.samplers.RandomSampler(seed=seed), goal, harness=True,
            guesses=False, queue=by_prediction))
    total = sum(row["cost"] for row in table.values())
    rows = []
    for name, rs in runs.items():
        costs = sorted(r.reached if r.reached is not None else total for r in rs)
        rows.append({"strategy": name, "median_s": statistics.median(costs),
                     "p90_s": costs[min(len(costs) - 1, int(0.9 * len(costs)))],
                     "missed": sum(r.reached is None for r in rs), "runs": len(rs)})
    return (rows, {n: [r.curve for r in rs] for n, rs in runs.items()}, table, total, best,
            len(space.enumerate()))


def _grid(table, space, grid_space, seed, goal) -> Replay:
    """Optuna's GridSampler: conditional settings make some grid points the same
    configuration; a point already measured costs nothing."""
    sampler = optuna.samplers.GridSampler(grid_space, seed=seed)
    optuna_study = optuna.create_study(sampler=sampler, direction="maximize")
    r, seen = Replay(table, goal), set()
    while r.reached is None and len(seen) < len(table):
        trial = optuna_study.ask()
        space.suggest(trial)
        k = key(trial.params)
        value = r.measure(k) if k in table and k not in seen else (
            table[k]["rate"] if k in table else 0.0)
        if k in table:  # one a table still being recorded lacks is passed over
            seen.add(k)
        try:
            optuna_study.tell(trial, value)
        except RuntimeError:  # the grid is done: GridSampler calls study.stop() outside optimize
            break
        if sampler.is_exhausted(optuna_study):
            break
    return r


def median_curve(curves: list[list[tuple[float, float]]], best: float, step: float,
                 end: float) -> list[tuple[float, float]]:
    """At each cost, the median over runs of the best found so far (as a share of the best)."""
    out, c = [], 0.0
    while c <= end:
        found = [max((b for cost, b in curve if cost <= c), default=0.0) for curve in curves]
        out.append((c, statistics.median(found) / best))
        c += step
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/replay"))
    p.add_argument("--table", type=Path, action="append",
                   help="a recorded grid study to replay (repeatable); default: record both")
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--doc", type=Path, help="write the markdown and curves to this folder")
    p.add_argument("--surface", metavar="PACKAGE.MODULE:FUNCTION",
                   help="replay against a response surface instead of a recorded table "
                        "(tests/benchmarks/surface_replay; e.g. "
                        "tests.benchmarks.surfaces.h100:gpt_1b_8gpu); needs --study")
    p.add_argument("--study", type=Path, help="with --surface: the study file whose space it is")
    p.add_argument("--budget", metavar="DURATION",
                   help="with --surface: run the harness's whole study within this simulated "
                        "budget (e.g. 1h: the search, then the final phases) and report the "
                        "best it names, instead of the cost to 0.97")
    p.add_argument("--family", metavar="SPACE",
                   help="replay on every surface of this space's family (gpt-1b-8gpu, "
                        "gpt2-small-1gpu; tests/benchmarks/surfaces/family.py)")
    p.add_argument("--surfaces", metavar="NAME,NAME",
                   help="with --family: only these members (base, comm-slow, drawn-0, ...)")
    p.add_argument("--jsonl", type=Path,
                   help="with --family: append each surface's line here (default "
                        "runs/family/SPACE-seedsN.jsonl); surfaces already in it are skipped")
    p.add_argument("--samplers", metavar="NAME,NAME", default="",
                   help="with --family: Optuna's samplers (tpe, gp, botorch) replayed too, "
                        "each through the harness's Tuner in its sampler's place")
    p.add_argument("--censor", type=float, metavar="HOURS",
                   help="with --samplers: stop an Optuna sampler's search not at 0.97 by "
                        "this many simulated hours (its cost then reads '> HOURS')")
    p.add_argument("--jobs", type=int, default=1,
                   help="with --family: surfaces replayed in this many processes at once")
    p.add_argument("--oracle-gemm", action="store_true",
                   help="with --family: a what-if, the estimator's compute at each surface's "
                        "own GEMM efficiency by micro-batch and width, as a device profile "
                        "measured there would give it (surface_replay/world.gemm_oracle)")
    p.add_argument("--family-report", type=Path, nargs="+", metavar="FILE.jsonl",
                   help="print the family tables of these JSON-lines files, nothing run")
    args = p.parse_args(argv)
    if args.family or args.family_report:
        from tests.benchmarks.surface_replay.family_run import cli

        cli(p, args)
        return
    if args.surface or args.study:
        if not (args.surface and args.study):
            p.error("--surface and --study go together")
        from tests.benchmarks.surface_replay.report import main as surface_main
        from training_harness.core.units import parse_duration

        budget_s = parse_duration(args.budget, "--budget") if args.budget else None
        doc = None
        if args.doc:
            tail = f"_budget{args.budget}" if args.budget else ""
            doc = args.doc / f"search_replay_surface_{args.study.stem}{tail}_{date.today()}.md"
        surface_main(args.surface, args.study, args.seeds, doc, budget_s)
        return
    tables = args.table
    if not tables:
        args.out.mkdir(parents=True, exist_ok=True)
        dist = args.out / "replay-2proc-study.toml"
        dist.write_text(tomli_w.dumps(DISTRIBUTED))
        tables = []
        for name, study_file in (("quickstart", ROOT / "studies" / "quickstart.toml"),
                                 ("replay-2proc", dist)):
            folder = args.out / f"table-{name}"
            if not (folder / "study.json").exists():
                record(study_file, folder)
            tables.append(folder)
    lines = [f"# Search strategies replayed on recorded tables, {date.today()}", "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, no GPU.", "",
             "    python tests/benchmarks/search_replay.py --seeds "
             f"{args.seeds}" + "".join(f" --table {t}" for t in args.table or [])
             + ("" if args.table else f" --out {args.out}")
             + (f" --doc {args.doc}" if args.doc else ""), "",
             "Cost: the measured seconds (each trial's wall clock, as recorded) a strategy "
             f"spends before it first measures a configuration within {TARGET} of the table's "
             f"best; median and 90th percentile over {args.seeds} seeds.", ""]
    curves_csv = ["table,strategy,cost_s,best_share"]
    for folder in tables:
        rows, curves, table, total, best, size = evaluate(folder, args.seeds)
        held = f"{len(table)}" if len(table) == size else f"{len(table)} of its {size}"
        lines += [f"## {folder.name}: {held} configurations, best {best:.4g} samples/s, "
                  f"all of them cost {total:.0f} s", "",
                  "| strategy | median cost (s) | p90 cost (s) | missed |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {r['strategy']} | {r['median_s']:.1f} | {r['p90_s']:.1f} | "
                  f"{r['missed']} of {r['runs']} |" for r in rows]
        lines.append("")
        for name, cs in curves.items():
            for c, share in median_curve(cs, best, total / 50, total):
                curves_csv.append(f"{folder.name},{name},{c:.2f},{share:.4f}")
    text = "\n".join(lines)
    print(text)
    if args.doc:
        args.doc.mkdir(parents=True, exist_ok=True)
        stem = (f"search_replay_{tables[0].name}_{date.today()}" if args.table
                else f"search_replay_cpu_{date.today()}")
        (args.doc / f"{stem}.md").write_text(text + "\n")
        (args.doc / f"{stem}_curves.csv").write_text("\n".join(curves_csv) + "\n")


if __name__ == "__main__":
    main()
