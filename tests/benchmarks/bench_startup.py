"""`harness bench`'s time beyond its steps, measured from outside the command.

    python tests/benchmarks/bench_startup.py --before ea66f3b --rounds 5

Runs `python -m training_harness bench PLAN --device cpu` (default: the quickstart plan) as a
user would, with this checkout's code and, with `--before REV`, that revision's
(from a temporary git worktree, same Python), one after the other in each round so
both see the same machine; each with a warm peak cache (a copy of one calibration
made at the start: a fresh copy per run, so no run inherits another's drop of a
figure) and with an empty one (a newcomer's first run: the calibration happens).

Overhead = the wall clock from the command's start to its exit, less its steps as
its record reports them (the warm-up's seconds, metrics.phases_s.warmup, and the
measured window). "output closed" is the same until the last holder of the
command's stdout let go (what a caller capturing the output waits for). Prints a
markdown table (median [min, max] over rounds, with the 1-minute load average at
each run's start), then the median of each phase of this checkout's runs
(metrics.phases_s; see training_harness.cli.bench_phases); with --old-phases, before that,
the phases of the code before the change, timed from inside a replay of its
cmd_bench (its record has no phases but the warm-up's).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: Path, plan: str, out: Path, cache: Path, extra: list[str], server: str,
        runtime: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "HARNESS_CACHE_DIR": str(cache),
           "XDG_RUNTIME_DIR": str(runtime), "HARNESS_WARM_SERVER": str(int(server == "warm"))}
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "training_harness", "bench", str(code / plan),
                             "--device", "cpu", "--out", str(out), *extra], cwd=code, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.wait(timeout=900)
    exited = time.monotonic() - t0
    stdout, stderr = proc.communicate(timeout=900)
    closed = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{code}: {plan} failed:\n{stdout[-2000:]}{stderr[-2000:]}")
    m = json.loads((out / "result.json").read_text())["metrics"]
    steps = m["window"]["seconds"] + m["phases_s"]["warmup"]
    return {"wall": exited, "closed": closed, "steps": steps, "overhead": exited - steps,
            "overhead_closed": closed - steps, "load": load,
            "phases": m.get("phases_s") or {}, "window": m["window"]["seconds"]}


# With --old-phases: the phases of the code before the bench process stopped importing
# torch (ea66f3b's cmd_bench, step by step, timed from inside; warm cache only).
OLD_PHASES = """
import os, sys, time
t = time.monotonic()
with open("/proc/self/stat") as f:
    start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
phases = {"python": time.clock_gettime(time.CLOCK_BOOTTIME) - start}
def lap(name):
    global t
    now = time.monotonic(); phases[name] = now - t; t = now
from training_harness.cli.main import build_parser, plan_from_args
args = build_parser().parse_args(["bench", sys.argv[1], "--device", "cpu", "--out", sys.argv[2]])
lap("cli")
from training_harness.strategies.registry import load_builtins
load_builtins()
from training_harness.launch import rank_server
from training_harness.launch.local import launch
from training_harness.measure.prepare import prepare, flops_per_sample, peak_for_workload
from training_harness.core.device import RuntimeEnv, resolve_device
from training_harness.estimator import estimate
from training_harness.measure.peaks import autocast_dtype_name
from training_harness.workloads import load_workload
from training_harness.strategies.compose import resolved, validate
lap("imports (torch, torch._dynamo, the strategies)")
plan = plan_from_args(args)
lap("plan")
rank_server.warm_up()  # its imports begin here, beside what follows
device = resolve_device(plan.device); runtime = RuntimeEnv.detect(device.type)
workload = load_workload(plan.workload, plan.workload_args)
validate(plan, runtime); plan = resolved(plan)
lap("check")
peak = peak_for_workload(device, runtime.device_name, autocast_dtype_name(plan.strategies),
                         workload)
lap("peaks")
flops = flops_per_sample(plan, workload)
lap("flops")
estimate(plan, workload, runtime, peak.used.flops, flops)
lap("estimate")
prepared = prepare(plan).checked()  # again, as the command does it: the env, mostly
lap("env (and prepare again)")
ctx = rank_server._server()
p = ctx.Process(target=time.sleep, args=(0,)); p.start(); p.join()
lap("rank_server (what is left of its imports)")
result = launch(prepared, sys.argv[2], "bench")
m = result.metrics
rank = m["phases_s"]["setup"] + m["phases_s"]["warmup"] + m["window"]["seconds"]
phases["launch"] = time.monotonic() - t - rank
phases.update(setup=m["phases_s"]["setup"], warmup=m["phases_s"]["warmup"])
import json
print(json.dumps({**phases, "(window)": m["window"]["seconds"]}))
"""


def old_phases(code: Path, plan: str, out: Path, cache: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code), "HARNESS_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", OLD_PHASES, str(code / plan), str(out)],
                          cwd=code, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{code}: the old phases failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--before", help="a revision to compare with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--plan", default="studies/plans/quickstart.toml")
    p.add_argument("--no-cold", action="store_true", help="only the warm peak cache")
    p.add_argument("--server", choices=("own", "warm", "both"), default="both",
                   help="the command's own rank server (HARNESS_WARM_SERVER=0), one kept "
                        "warm between commands (training_harness.launch.warm_server: started by an "
                        "untimed run first), or both side by side")
    p.add_argument("--short", action="store_true",
                   help="1 warm-up and 2 measured steps (--steps 2 --warmup-steps 1): the "
                        "same model and optimizer, so the same fixed cost, in a shorter run "
                        "(more rounds on a busy machine)")
    p.add_argument("--old-phases", action="store_true",
                   help="also time --before's phases from inside, step by step (ea66f3b's "
                        "cmd_bench replayed), once a round with the warm cache")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_startup."))
    runtime = tmp / "runtime"  # the warm servers' folder: this run's own
    runtime.mkdir(mode=0o700)
    servers = ["own", "warm"] if args.server == "both" else [args.server]
    codes = {"now": ROOT}
    try:
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", str(tmp / "before"),
                            args.before], cwd=ROOT, check=True, capture_output=True)
            codes = {f"before ({args.before})": tmp / "before", "now": ROOT}
        warm = tmp / "warm-cache"
        subprocess.run([sys.executable, "-c", "import torch; from training_harness.measure."
                        "peaks import measured_peak; "
                        "print(measured_peak(torch.device('cpu'), 'fp32'))"],
                       env={**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_CACHE_DIR": str(warm)},
                       check=True)
        caches = ["warm"] + ([] if args.no_cold else ["cold"])
        rows: dict[tuple[str, str, str], list[dict]] = {}
        old: list[dict[str, float]] = []
        extra = ["--steps", "2", "--warmup-steps", "1"] if args.short else []

        def one(r: int, name: str, cache: str, server: str, timed: bool = True) -> None:
            # one folder per kind of run, filled afresh: a warm server serves only the
            # environment it started in, and HARNESS_CACHE_DIR is part of it
            folder = tmp / f"cache-{cache}-{server}-{name.split()[0]}"
            shutil.rmtree(folder, ignore_errors=True)
            if cache == "warm":
                shutil.copytree(warm, folder)
            got = run(codes[name], args.plan, tmp / "out", folder, extra, server, runtime)
            if timed:
                rows.setdefault((name, cache, server), []).append(got)
            print(f"round {r + 1} {name} {cache} {server}{'' if timed else ' (untimed)'}: "
                  f"wall {got['wall']:.2f} steps {got['steps']:.2f} overhead "
                  f"{got['overhead']:.2f} load {got['load']:.2f}", file=sys.stderr, flush=True)

        if "warm" in servers:  # start each kind of run's warm server
            for cache in caches:
                for name in codes:
                    one(-1, name, cache, "warm", timed=False)
        for r in range(args.rounds):
            names = list(codes) if r % 2 == 0 else list(reversed(codes))
            if args.old_phases and args.before:
                folder = tmp / f"cache-{r}-old-phases"
                shutil.copytree(warm, folder)
                old.append(old_phases(tmp / "before", args.plan, tmp / "out", folder))
            for cache in caches:
                for server in servers:
                    for name in names:
                        one(r, name, cache, server)
        print("| code | peak cache | rank server | wall clock | its steps (warm-up + window) "
              "| overhead | overhead, output closed | load (1 min) |\n| --- | --- | --- | --- "
              "| --- | --- | --- | --- |")
        for (name, cache, server), runs in rows.items():
            cells = [summary([x[k] for x in runs])
                     for k in ("wall", "steps", "overhead", "overhead_closed", "load")]
            print(f"| {name} | {cache} | {server} | " + " | ".join(cells) + " |")
        if old:
            print(f"\nphases, before ({args.before}), warm cache, timed from inside "
                  "(median [min, max] s):")
            for k in dict.fromkeys(k for x in old for k in x):
                print(f"  {k:44} {summary([x.get(k) or 0.0 for x in old])}")
        for (name, cache, server), runs in rows.items():
            if name != "now":
                continue
            keys = list(dict.fromkeys(k for x in runs for k in x["phases"]))
            print(f"\nphases, {name}, {cache} cache, {server} rank server (median [min, max] s):")
            for k in keys:
                print(f"  {k:12} {summary([x['phases'].get(k) or 0.0 for x in runs])}")
            print(f"  {'(window)':12} {summary([x['window'] for x in runs])}")
    finally:
        subprocess.run([sys.executable, "-m", "training_harness.launch.warm_server", "--stop"],
                       env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_RUNTIME_DIR": str(runtime)},
                       capture_output=True)
        if args.before:
            subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "before")],
                           cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
