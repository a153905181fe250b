"""`search_replay.py --family SPACE`: the three strategies on every surface of a family
(tests/benchmarks/surfaces/family.py), one JSON line per surface as each finishes.

Per space the study is checked once (prepare_study) and its configurations listed once;
each surface then gets its own truth (its best within the memory budget, its goal) and
`seeds` runs of the harness's search (run_seed: the search to its own end, i.e. the study's
budget less the final phases' reserve, unless it reached 0.97 and an hour has passed),
random search and the estimator's order, and with `samplers` Optuna's samplers
(others.optuna_samplers) through the same run_seed, only the sampler swapped. The
estimator's predictions (the torch-side helper's answers) are the same for every surface,
so they are cached across them.

The output file is appended to: a surface already in it with the same seeds is skipped,
so an interrupted run resumes where it stopped. `jobs` > 1 runs surfaces in that many
processes (each checks the study once); the lines then come in the order they finish.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TARGET = 0.97
HOUR = 3600.0


def study_file(space: str) -> Path:
    return ROOT / "studies" / f"{space}.toml"


def done_in(out: Path, samplers: tuple[str, ...] = ()) -> set[tuple[str, str, int]]:
    """(space, surface, seeds) of the lines already in `out` that hold every one of
    `samplers`' runs."""
    if not out.exists():
        return set()
    seen = set()
    for line in out.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if all(n in r["runs"] for n in samplers):
                seen.add((r["space"], r["surface"], r["seeds"]))
    return seen


def tree() -> str:
    """The commit that last changed harness/ (the code under test), "+dirty" when harness/
    has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True
                              ).stdout.strip()
    last = git("log", "-1", "--format=%h", "--", "harness") or "unknown"
    return last + ("+dirty" if git("status", "--porcelain", "--", "harness") else "")


_STATE: dict[str, Any] = {}  # per process: the space's setup and its listed configurations


def _setup(space: str) -> tuple[Any, Any]:
    """This process's checked study and listed configurations for `space` (made once;
    the simulated world stays entered for the life of the process)."""
    from tests.benchmarks.surface_replay.harness_run import prepare_study
    from tests.benchmarks.surface_replay.others import listed
    from tests.benchmarks.surface_replay.world import h100_world
    from tests.benchmarks.surfaces.family import SPACES, members

    if _STATE.get("space") != space:
        if "stack" in _STATE:
            _STATE["stack"].close()
        stack = contextlib.ExitStack()
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="family-", dir=shm)))
        stack.enter_context(h100_world(SPACES[space].gpus))
        setup = prepare_study(study_file(space), members(space, drawn=0)[0], tmp)
        _STATE.update(space=space, stack=stack, setup=setup, given=listed(setup.checked.space))
    return _STATE["setup"], _STATE["given"]


def _searched(run: Any, seed: int, best: float, cpu_s: float) -> dict[str, Any]:
    """A run of the real Tuner (the harness's search, or an Optuna sampler in its place)."""
    return {"seed": seed, "reached_s": run.reached_s, "share_1h": run.best_at(HOUR) / best,
            "launched": run.launched, "stopped": run.stopped, "elapsed_s": run.elapsed_s,
            "named_share": (run.named or {}).get("share"),
            "named_over_budget": bool((run.named or {}).get("over_measured")),
            "censored_s": run.censored_s, "cpu_s": cpu_s}


def run_surface(space: str, name: str, seeds: int, samplers: tuple[str, ...] = (),
                horizon_s: float | None = None, oracle: bool = False) -> dict[str, Any]:
    """One surface's line: the space's truth under it and every seed's runs (an Optuna
    sampler's censored at `horizon_s`, the harness's never); `oracle`: the estimator's
    compute at the surface's own GEMM efficiency (world.gemm_oracle)."""
    from tests.benchmarks.surface_replay.harness_run import run_seed
    from tests.benchmarks.surface_replay.others import (
        enumerate_space,
        optuna_samplers,
        run_estimator,
        run_random,
    )
    from tests.benchmarks.surface_replay.world import gemm_oracle
    from tests.benchmarks.surfaces.family import surface

    t0, cpu0 = time.monotonic(), time.process_time()
    setup, given = _setup(space)
    s = surface(space, name)
    setup.surface, setup.truth = s, s.truth
    setup.helper.adjust = gemm_oracle(s.assumptions) if oracle else None
    truth = enumerate_space(setup.checked.space, s.truth, setup.checked.budget_bytes, given)
    setup.size, setup.best, setup.goal = len(truth.plans), truth.best, TARGET * truth.best
    runs: dict[str, list[dict[str, Any]]] = {"harness": [], "random": [], "estimator": [],
                                             **{n: [] for n in samplers}}
    for seed in range(seeds):
        for arm, sampler in {"harness": None, **optuna_samplers(seed, samplers)}.items():
            cpu = time.process_time()
            run = run_seed(setup, seed, sampler=sampler,
                           horizon_s=None if sampler is None else horizon_s)
            runs[arm].append(_searched(run, seed, truth.best, time.process_time() - cpu))
        r = run_random(setup, truth, seed)
        runs["random"].append({"seed": seed, "reached_s": r.reached_s,
                               "share_1h": r.best_at(HOUR) / truth.best,
                               "launched": r.launched})
        e = run_estimator(setup, truth, seed)
        runs["estimator"].append({"seed": seed, "reached_s": e.reached_s,
                                  "launched": e.launched})
    return {
        "space": space, "surface": name, "assumes": s.__doc__, "seeds": seeds,
        "configurations": len(truth.plans), "statuses": truth.statuses, "best": truth.best,
        "near": sum(x >= TARGET * truth.best for x in truth.rates),
        "budget_s": setup.checked.study.budget.time_s,
        "budget_bytes": setup.checked.budget_bytes, "tree": tree(), "horizon_s": horizon_s,
        "wall_s": time.monotonic() - t0, "cpu_s": time.process_time() - cpu0,
        "oracle": "gemm" if oracle else None,
        "runs": runs,
    }


def run_family(space: str, names: list[str], seeds: int, out: Path, jobs: int = 1,
               say: Callable[[str], None] = print, samplers: tuple[str, ...] = (),
               horizon_s: float | None = None, oracle: bool = False) -> None:
    """Every surface of `names` not yet in `out`, its line appended as it finishes."""
    skip = done_in(out, samplers)
    todo = [n for n in names if (space, n, seeds) not in skip]
    if len(todo) < len(names):
        say(f"{out}: {len(names) - len(todo)} surface(s) already there, skipped")
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(line: dict[str, Any]) -> None:
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")
        missed = ", ".join(
            f"{arm} {sum(r['reached_s'] is None for r in line['runs'][arm])}"
            for arm in ("harness", *samplers))
        say(f"{space}/{line['surface']}: not at 0.97 (missed or censored) in {seeds} seeds: "
            f"{missed}; "
            f"{line['wall_s']:.0f} s wall, {line['cpu_s']:.0f} s CPU")

    if jobs <= 1:
        for name in todo:
            write(run_surface(space, name, seeds, samplers, horizon_s, oracle))
        return
    # spawn: a fresh interpreter per worker (no forked torch or Optuna state)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo) or 1), mp_context=ctx,
                             initializer=_quiet) as pool:
        futures = [pool.submit(run_surface, space, name, seeds, samplers, horizon_s, oracle)
                   for name in todo]
        for f in as_completed(futures):
            write(f.result())


def _quiet() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def cli(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """search_replay.py's --family and --family-report."""
    from tests.benchmarks.surface_replay.family_report import report

    if args.family_report:
        print(report(args.family_report))
        return
    from tests.benchmarks.surfaces.family import SPACES, members

    if args.family not in SPACES:
        p.error(f"--family {args.family}: one of {', '.join(SPACES)}")
    names = [s.__name__ for s in members(args.family)]
    if args.surfaces:
        wanted = [n.strip() for n in args.surfaces.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names and not n.startswith("drawn-")]
        if unknown:
            p.error(f"--surfaces: no {', '.join(unknown)} in the family ({', '.join(names)})")
        names = wanted
    samplers = tuple(n.strip() for n in args.samplers.split(",") if n.strip())
    from tests.benchmarks.surface_replay.others import optuna_samplers

    unknown = set(samplers) - set(optuna_samplers(0))
    if unknown:
        p.error(f"--samplers: no {', '.join(sorted(unknown))} here (tpe, gp; botorch with "
                "the [replay] extra)")
    tail = "".join(f"-{n}" for n in samplers)
    jsonl = args.jsonl or Path("runs") / "family" / f"{args.family}-seeds{args.seeds}{tail}.jsonl"
    load, t0 = os.getloadavg(), time.monotonic()
    run_family(args.family, names, args.seeds, jsonl, args.jobs,
               say=lambda text: print(text, file=sys.stderr, flush=True), samplers=samplers,
               horizon_s=args.censor * HOUR if args.censor else None,
               oracle=args.oracle_gemm)
    print(report([jsonl]))
    print(f"{len(names)} surface(s) in {time.monotonic() - t0:.0f} s wall on "
          f"{os.cpu_count()} CPUs (shared: load average {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after); lines in {jsonl}")
