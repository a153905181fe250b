"""`harness bench`'s time beyond its steps, measured from outside the command.

    python tests/benchmarks/bench_startup.py --before 48ddd94 --rounds 5

Runs `python -m training_harness bench PLAN --device cpu` (default: the quickstart plan)
as a user would, with this checkout's code and, with `--before REV`, that revision's,
one after the other in each round (their order alternating) so both see the same
machine. Each tree is built into a wheel of its own and run from it (PYTHONPATH, ahead
of the editable install): the code measured is the tree named, never this checkout
twice. Each run has a warm peak cache (a fresh copy of one calibration made at the
start) or, without --no-cold, an empty one (a newcomer's first run: it calibrates).

Overhead = the wall clock from the command's start to its exit, less its steps as its
record reports them (the warm-up's seconds, metrics.phases_s.warmup, and the measured
window). "output closed" is the same until the last holder of the command's stdout let
go (what a caller capturing the output waits for). Prints a markdown table (median
[min, max] over rounds, with the 1-minute load average at each run's start), then the
median of each phase of this checkout's runs (metrics.phases_s; see
training_harness.cli.bench_phases).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE = ("harness", "strategies", "kernels", "reports", "pyproject.toml", "README.md")


def built(tree: Path, into: Path) -> Path:
    """The tree's wheel, extracted into `into` (a folder for PYTHONPATH)."""
    dist = into.with_suffix(".dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(dist), str(tree)], check=True)
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
    return into


def run(site: Path, plan: Path, out: Path, cache: Path, extra: list[str]) -> dict:
    # HARNESS_WARM_SERVER=0: a revision that still had the server kept between commands
    # runs with its own, as every command of a fresh environment did (ignored since)
    env = {**os.environ, "PYTHONPATH": str(site), "HARNESS_CACHE_DIR": str(cache),
           "HARNESS_WARM_SERVER": "0"}
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "training_harness", "bench", str(plan),
                             "--device", "cpu", "--out", str(out), *extra], cwd=out.parent,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.wait(timeout=900)
    exited = time.monotonic() - t0
    stdout, stderr = proc.communicate(timeout=900)
    closed = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{site}: {plan} failed:\n{stdout[-2000:]}{stderr[-2000:]}")
    m = json.loads((out / "result.json").read_text())["metrics"]
    steps = m["window"]["seconds"] + m["phases_s"]["warmup"]
    return {"wall": exited, "closed": closed, "steps": steps, "overhead": exited - steps,
            "overhead_closed": closed - steps, "load": load,
            "phases": m.get("phases_s") or {}, "window": m["window"]["seconds"]}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--before", help="a revision to compare with (one with training_harness)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--plan", default="studies/plans/quickstart.toml")
    p.add_argument("--no-cold", action="store_true", help="only the warm peak cache")
    p.add_argument("--short", action="store_true",
                   help="1 warm-up and 2 measured steps: the same fixed cost, a shorter run")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup."))
    try:
        trees = {"now": ROOT}
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "before"),
                            args.before], cwd=ROOT, check=True, capture_output=True)
            trees = {f"before ({args.before})": tmp / "before", "now": ROOT}
        sites = {}
        for i, (name, tree) in enumerate(trees.items()):
            src = tmp / f"src{i}"  # a copy: nothing is built in the trees themselves
            src.mkdir()
            for part in TREE:
                (shutil.copytree if (tree / part).is_dir() else shutil.copy)(tree / part,
                                                                              src / part)
            sites[name] = built(src, tmp / f"site{i}")
        warm = tmp / "warm-cache"
        subprocess.run([sys.executable, "-c", "import torch; from training_harness.measure."
                        "peaks import measured_peak; "
                        "print(measured_peak(torch.device('cpu'), 'fp32'))"],
                       env={**os.environ, "PYTHONPATH": str(sites["now"]),
                            "HARNESS_CACHE_DIR": str(warm)}, check=True)
        caches = ["warm"] + ([] if args.no_cold else ["cold"])
        rows: dict[tuple[str, str], list[dict]] = {}
        extra = ["--steps", "2", "--warmup-steps", "1"] if args.short else []
        (tmp / "work").mkdir()
        for r in range(args.rounds):
            names = list(trees) if r % 2 == 0 else list(reversed(trees))
            for cache in caches:
                for name in names:
                    folder = tmp / f"cache-{cache}-{r}-{name.split()[0]}"
                    if cache == "warm":
                        shutil.copytree(warm, folder)
                    got = run(sites[name], ROOT / args.plan, tmp / "work" / "out", folder,
                              extra)
                    rows.setdefault((name, cache), []).append(got)
                    print(f"round {r + 1} {name} {cache}: wall {got['wall']:.2f} steps "
                          f"{got['steps']:.2f} overhead {got['overhead']:.2f} load "
                          f"{got['load']:.2f}", file=sys.stderr, flush=True)
        print("| code | peak cache | wall clock | its steps (warm-up + window) | overhead "
              "| overhead, output closed | load (1 min) |\n| --- | --- | --- | --- | --- "
              "| --- | --- |")
        for (name, cache), runs in rows.items():
            cells = [summary([x[k] for x in runs])
                     for k in ("wall", "steps", "overhead", "overhead_closed", "load")]
            print(f"| {name} | {cache} | " + " | ".join(cells) + " |")
        for (name, cache), runs in rows.items():
            if name != "now":
                continue
            keys = list(dict.fromkeys(k for x in runs for k in x["phases"]))
            print(f"\nphases, {name}, {cache} cache (median [min, max] s):")
            for k in keys:
                print(f"  {k:12} {summary([x['phases'].get(k) or 0.0 for x in runs])}")
            print(f"  {'(window)':12} {summary([x['window'] for x in runs])}")
    finally:
        if args.before:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "before")],
                           cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
