"""A trial's overhead: its wall clock minus its warm-up and measured steps, side by side.

    python tests/benchmarks/trial_overhead.py --before a758ef2 --rounds 5

`harness bench` of the quickstart plan (one process) and of the ddp plan (two
processes, gloo) on the CPU, and each plan's trials as a study runs them (one
process preparing each through the torch-side helper and launching it; the first
trial, which waits for the rank server's imports, left out), each running
this checkout's code and, with
`--before REV`, that revision's (from a temporary git worktree, same Python) one
after the other, so both see the same machine. A run's overhead is the bench
command's wall clock minus the steps it exists to measure: warm-up and window.
The warm-up's seconds come from the record's `metrics.phases_s` where it has them;
a revision without them is charged its warm-up at the window's mean step time (warm-up
steps are slower, so this flatters the old code). Prints a markdown table: median
[min, max] over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANS = {"1 process (quickstart)": "studies/plans/quickstart.toml",
         "2 processes (ddp, gloo)": "studies/plans/ddp.toml"}


def bench(code: Path, plan: str, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "training_harness", "bench", str(code / plan),
                           "--device", "cpu", "--out", str(out)], cwd=code, env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{code}: {plan} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    record = json.loads((out / "result.json").read_text())
    m, plan_table = record["metrics"], record["plan"]
    window = m["window"]["seconds"] if m.get("window") else (
        m["step_time_s"]["median"] * plan_table["steps"])
    phases = m.get("phases_s") or {}
    warmup = phases.get("warmup", window / plan_table["steps"] * plan_table["warmup_steps"])
    return {"wall": wall, "overhead": wall - warmup - window, "steps": warmup + window}


# As a study runs its trials: one process (the tuner's side) prepares each plan through
# the torch-side helper and launches it; overhead = that wall clock minus warm-up and window.
STUDY_SCRIPT = """
import json, sys, time, tomllib
from pathlib import Path
from training_harness.core.plan import Plan
from training_harness.launch.local import launch
from training_harness.launch.torch_helper import shared
plan_file, out, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
plan = Plan.from_dict(tomllib.loads(Path(plan_file).read_text()), where=plan_file)
plan = plan.replace(device="cpu")
probe = shared()
probe.prepare(plan)  # the helper's start is the study's, not a trial's
try:
    from training_harness.launch import rank_server
    rank_server.warm_up()  # as harness tune does when it opens the study
except ImportError:
    pass
rows = []
for i in range(n):
    t0 = time.perf_counter()
    result = launch(probe.prepare(plan), out / str(i), "bench")
    wall = time.perf_counter() - t0
    m = result.metrics
    window = m["window"]["seconds"] if m.get("window") else m["step_time_s"]["median"] * plan.steps
    warm = (m.get("phases_s") or {}).get("warmup", window / plan.steps * plan.warmup_steps)
    rows.append({"wall": wall, "steps": warm + window, "overhead": wall - warm - window})
print(json.dumps(rows))
"""


def study(code: Path, plan: str, out: Path, n: int) -> list[dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-c", STUDY_SCRIPT, str(code / plan), str(out), str(n)],
                          cwd=code, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{code}: study of {plan} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a git revision to measure beside this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5, help="trials of the study mode")
    ap.add_argument("--processes", type=int, choices=(1, 2), help="only this plan (default both)")
    args = ap.parse_args()
    plans = {k: v for k, v in PLANS.items()
             if args.processes is None or k.startswith(f"{args.processes} process")}
    with tempfile.TemporaryDirectory() as tmp:
        codes = {"now": ROOT}
        if args.before:
            old = Path(tmp) / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), args.before],
                           cwd=ROOT, check=True, capture_output=True)
            codes = {f"before ({args.before})": old, "now": ROOT}
        try:
            runs: dict[tuple[str, str], list[dict[str, float]]] = {}
            for r in range(args.rounds):
                for label, plan in plans.items():
                    for name, code in codes.items():
                        out = Path(tmp) / f"{name[:6]}-{Path(plan).stem}-{r}"
                        runs.setdefault((f"harness bench, {label}", name), []).append(
                            bench(code, plan, out))
            for label, plan in plans.items():  # trials 2.. of a study (the first warms up)
                for name, code in codes.items():
                    rows = study(code, plan, Path(tmp) / f"study-{name[:6]}-{Path(plan).stem}",
                                 args.trials)
                    runs[(f"in a study, {args.trials} trials, {label}", name)] = rows[1:]
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                               capture_output=True)
    print(f"{args.rounds} rounds of each bench; seconds: median [min, max]\n")
    print("| trial | code | bench wall clock | its steps (warm-up + window) | overhead |")
    print("| --- | --- | --- | --- | --- |")
    for (label, name), rs in runs.items():
        print(f"| {label} | {name} | {summary([x['wall'] for x in rs])} | "
              f"{summary([x['steps'] for x in rs])} | {summary([x['overhead'] for x in rs])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
