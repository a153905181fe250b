"""A trial's overhead: its wall clock minus its warm-up and measured steps, side by side.

    python tests/benchmarks/trial_overhead.py --before a758ef2 --rounds 5

`harness bench` of the quickstart plan (one process) and of the ddp plan (two
processes, gloo) on the CPU, each round running this checkout's code and, with
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
    done = subprocess.run([sys.executable, "-m", "harness", "bench", str(code / plan),
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


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a git revision to measure beside this checkout")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
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
                for label, plan in PLANS.items():
                    for name, code in codes.items():
                        out = Path(tmp) / f"{name[:6]}-{Path(plan).stem}-{r}"
                        runs.setdefault((label, name), []).append(bench(code, plan, out))
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                               capture_output=True)
    print(f"{args.rounds} rounds, seconds: median [min, max]\n")
    print("| trial | code | bench wall clock | its steps (warm-up + window) | overhead |")
    print("| --- | --- | --- | --- | --- |")
    for (label, name), rs in runs.items():
        print(f"| {label} | {name} | {summary([x['wall'] for x in rs])} | "
              f"{summary([x['steps'] for x in rs])} | {summary([x['overhead'] for x in rs])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
