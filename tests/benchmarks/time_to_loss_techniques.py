"""Time to target of each technique that changes the maths against one AdamW baseline,
for docs/benchmarks: steps, samples and time to target over three seeds, and a verdict.

    HARNESS_CACHE_DIR=runs/ttl-techniques/cache \\
      python tests/benchmarks/time_to_loss_techniques.py --out runs/ttl-techniques \\
      [--only adamw,lars-5,...] [--remeasure 1]

Every row is the same workload, data, target, global batch and seeds as the baseline
(studies/time-to-loss-cpu.toml's at global batch 16: its lr needs no scaling); the
baseline's settings are held fixed and each technique gets only the small sweep of its
own settings listed in VARIANTS. Each row is one `harness bench` trial with a [target]
table (three runs to the target, then the measured steps); a trial measured while the
machine was busy is measured again (steps from the cache), as time_to_loss_table.py does.

Verdict against the baseline, on time to target over seeds: "sooner beyond the seeds'
spread" (this row's slowest seed before the baseline's fastest), "later beyond the
seeds' spread" (the other way round), "within the spread" (overlapping), "missed" (a
seed did not reach the target).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from time_to_loss_table import (  # noqa: E402
    QUIET_WAIT_S,
    _seen,
    busy,
    convergence_cells,
    quietest,
)

STUDY = "studies/time-to-loss-cpu.toml"
BATCH = 16
# label -> (what it is, the strategies, the lr). The baseline first.
VARIANTS: dict[str, tuple[str, dict[str, Any], float]] = {
    "adamw": ("AdamW (baseline)", {}, 1e-3),
    "lars-5": ("LARS, lr 5", {"lars": {}}, 5.0),
    "lars-10": ("LARS, lr 10", {"lars": {}}, 10.0),
    "muon-1e-3": ("Muon, lr 1e-3", {"muon": {}}, 1e-3),
    "muon-3e-3": ("Muon, lr 3e-3", {"muon": {}}, 3e-3),
    "ema-0.95": ("AdamW + EMA, decay 0.95", {"averaging": {"decay": 0.95}}, 1e-3),
    "ema-0.99": ("AdamW + EMA, decay 0.99", {"averaging": {"decay": 0.99}}, 1e-3),
}


def base_plan():
    """The study's plan at global batch 16, micro-batch 16, its [target] and seeds."""
    from harness.study.search_space import SearchSpace
    from harness.study.study_file import Study

    study = Study.from_toml(STUDY)
    space = SearchSpace.of(study, study.device)
    for params in space.enumerate():
        plan = space.plan(params)
        if (plan.batch_size == BATCH and plan.micro_batch_size == BATCH
                and not set(plan.strategies)):
            return plan
    raise SystemExit(f"{STUDY} has no AdamW plan at global batch {BATCH}")


def plan_for(label: str):
    _, strategies, lr = VARIANTS[label]
    plan = base_plan()
    plan = plan.replace(name=f"ttl-{label}", strategies={k: dict(v) for k, v in
                                                           strategies.items()})
    plan.optimizer.lr = lr
    return plan


def run(label: str, out: Path, remeasure: int) -> dict | None:
    folder = out / label
    result = folder / "result.json"
    for attempt in range(remeasure + 1):
        if result.is_file() and not busy(result):
            break
        if result.is_file():
            if attempt == remeasure:
                break
            kept = len(list(folder.glob("result-busy-*.json")))
            result.rename(folder / f"result-busy-{kept}.json")
            time.sleep(QUIET_WAIT_S)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.toml").write_text(plan_for(label).to_toml())
        print(f"[{label}] {time.strftime('%H:%M:%S')} load {load()}", flush=True)
        subprocess.run([sys.executable, "-m", "harness", "bench", str(folder / "plan.toml"),
                        "--out", str(folder), "--timeout", "3600"], check=False)
    return quietest(folder) if result.is_file() else None


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def spread(r: dict) -> list[float] | None:
    conv = r["metrics"].get("convergence") or {}
    return conv.get("time_spread_s") if conv.get("reached") else None


def verdict(row: dict, base: dict) -> str:
    mine, theirs = spread(row), spread(base)
    if mine is None:
        return "missed"
    if theirs is None:
        return "reached (the baseline missed)"
    if mine[1] < theirs[0]:
        return "sooner beyond the seeds' spread"
    if mine[0] > theirs[1]:
        return "later beyond the seeds' spread"
    return "within the spread"


def table(rows: dict[str, dict]) -> str:
    base = rows.get("adamw")
    lines = ["| technique | step time | steps to target, median [min–max] | samples to "
             "target | time to target, median [min–max over seeds] | verdict | busy |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for label, r in rows.items():
        conv = r["metrics"].get("convergence") or {}
        seen = _seen(r)
        share = seen.get("other_cpu_share")
        busy_cell = ("" if not seen.get("flagged") else
                     f"others {share:.0%}" if share is not None else
                     f"load {r['metrics'].get('load')}")
        cell_steps, cell_time, samples = convergence_cells(conv, lambda t: f"{t:.1f} s")
        step = conv.get("step_time_s")
        what = VARIANTS[label][0]
        mark = "baseline" if label == "adamw" else (verdict(r, base) if base else "—")
        lines.append(f"| {what} | {step * 1000:.1f} ms | {cell_steps} | {samples} | "
                     f"{cell_time} | {mark} | {busy_cell} |" if step else
                     f"| {what} | — | {cell_steps} | {samples} | {cell_time} | {mark} | "
                     f"{busy_cell} |")
    return "\n".join(lines)


def steps_only(label: str, steps: int = 20) -> dict:
    """In this process with one intra-op thread (two spin-wait on a loaded 2-core machine:
    steps of seconds instead of tens of ms): each seed's run to the target, through the
    shared cache, and the median of `steps` timed steps; a record shaped as bench's."""
    import torch

    from harness.core.target import maths_key
    from harness.measure import target_cache
    from harness.measure.convergence import train_to_target
    from harness.measure.time_to_target import summarize
    from harness.workloads import load_workload
    from strategies import compose, resolved

    torch.set_num_threads(1)
    # settings written out in full, as bench records a plan: the same maths key
    plan = resolved(plan_for(label))
    workload = load_workload(plan.workload, plan.workload_args)
    runs = []
    for seed in plan.target.seeds:
        key = maths_key(plan.to_dict(), seed, "cpu")
        run_ = target_cache.lookup(key)
        if run_ is None:
            run_ = train_to_target(plan, workload, torch.device("cpu"), None, seed)
            target_cache.store(key, run_)
        runs.append(run_)
        print(f"[{label}] seed {seed}: {run_['steps_to_target']} steps", flush=True)
    torch.manual_seed(0)
    setup = compose(workload.build_model(), plan.replace(target=None), "cpu")
    times = []
    for s in range(steps + 2):
        batch = workload.batch(plan.batch_size, s, "cpu")
        t0 = time.perf_counter()
        setup.step([batch], workload.loss)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[2:])
    conv = summarize(runs, step_s, plan.target.loss, plan.to_dict())
    return {"plan": plan.to_dict(), "metrics": {"convergence": conv, "load": load(),
            "interference": {"flagged": True, "other_cpu_share": None}}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--only", default="", help="these labels, e.g. adamw,lars-5")
    p.add_argument("--steps-only", action="store_true",
                   help="no bench trial: runs to the target and a step time in this "
                        "process, one thread (see steps_only)")
    p.add_argument("--remeasure", type=int, default=1,
                   help="times a trial measured on a busy machine is measured again")
    args = p.parse_args()
    labels = [x for x in args.only.split(",") if x] or list(VARIANTS)
    rows = {}
    for label in labels:
        if args.steps_only:
            r = steps_only(label)
            (args.out / label).mkdir(parents=True, exist_ok=True)
            (args.out / label / "steps-only.json").write_text(json.dumps(r, default=str))
        else:
            r = run(label, args.out, args.remeasure)
        if r is not None:
            rows[label] = r
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "rows.json").write_text(json.dumps(
        {k: v["metrics"].get("convergence") for k, v in rows.items()}, default=str))
    print(text)


if __name__ == "__main__":
    main()
