"""Every configuration of a time-to-loss study, each as its own `harness bench` trial, and
the table for docs/benchmarks: time to target for each optimizer at each global batch.

    python tests/benchmarks/time_to_loss_table.py studies/time-to-loss-cpu.toml \
        --out runs/time-to-loss-cpu-table [--seeds 0,1,2]

The trials are those `harness tune` runs for the study's grid (its search space, the
same plans), one after another; steps to target come from the shared cache
($HARNESS_CACHE_DIR/steps_to_target.json), so a global batch's second micro-batch size
trains nothing. A configuration already in --out is read, not run again, unless it was
measured while the machine was busy (then it is measured again, up to REMEASURE times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# A trial measured while others used the CPUs is measured again (its steps to target come
# from the cache, so only its step time is measured anew), as the tuner does.
REMEASURE = 3
QUIET_WAIT_S = 20


def plans(study_path: str, seeds: list[int] | None = None) -> list:
    """The study's grid; `seeds` in place of its [target].seeds (a seed is part of the
    cache's key, so fewer seeds take the others' steps from it all the same)."""
    import dataclasses

    from training_harness.study.search_space import SearchSpace
    from training_harness.study.study_file import Study

    study = Study.from_toml(study_path)
    space = SearchSpace.of(study, study.device)
    out = [space.plan(p) for p in space.enumerate()]
    if seeds:
        out = [p.replace(target=dataclasses.replace(p.target, seeds=seeds)) for p in out]
    return out


def measure_until_quiet(folder: Path, plan, remeasure: int, say: str,
                        timeout: str = "") -> None:
    """One `harness bench` trial of `plan` into `folder`, unless a quiet result is there;
    a result measured beside others' work is kept aside (result-busy-N.json) and measured
    again, up to `remeasure` times (quietest() then picks the least disturbed)."""
    result, runs = folder / "result.json", 0
    while True:
        if result.is_file() and (not busy(result) or runs > remeasure):
            return
        if result.is_file():
            kept = len(list(folder.glob("result-busy-*.json")))
            result.rename(folder / f"result-busy-{kept}.json")
            time.sleep(QUIET_WAIT_S)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plan.toml").write_text(plan.to_toml())
        print(f"{say} {time.strftime('%H:%M:%S')} load {os.getloadavg()}", flush=True)
        subprocess.run([sys.executable, "-m", "training_harness", "bench",
                        str(folder / "plan.toml"),
                        "--out", str(folder), *(["--timeout", timeout] if timeout else [])],
                       check=False)
        runs += 1


def run_all(study_path: str, out: Path, remeasure: int = REMEASURE,
            max_batch: int = 0, only: set[int] | None = None,
            seeds: list[int] | None = None, timeout: str = "") -> list[dict]:
    records = []
    for i, plan in enumerate(plans(study_path, seeds)):
        if max_batch and plan.batch_size > max_batch:
            continue
        if only and plan.batch_size not in only:
            continue
        folder = out / f"{i:02d}-b{plan.batch_size}-m{plan.micro_batch_size}-" \
                       f"{'lamb' if 'lamb' in plan.strategies else 'adamw'}"
        result = folder / "result.json"
        measure_until_quiet(folder, plan, remeasure, f"[{i}] {folder.name}", timeout)
        if result.is_file():
            records.append(quietest(folder))
    return records


def quietest(folder: Path) -> dict:
    """Of a configuration's measurements, the fastest on a quiet machine, else the fastest
    (others' work only ever slows a measurement)."""
    found = [json.loads(f.read_text()) for f in [folder / "result.json",
                                                  *sorted(folder.glob("result-busy-*.json"))]
             if f.is_file()]
    return min(found, key=lambda r: (bool(_seen(r).get("flagged")),
                                     r["metrics"]["step_time_s"]["median"] or float("inf")))


def _seen(r: dict) -> dict:
    return (r.get("metrics") or {}).get("interference") or {}


def busy(result: Path) -> bool:
    return bool(((json.loads(result.read_text()).get("metrics") or {})
                 .get("interference") or {}).get("flagged"))


def convergence_cells(conv: dict, seconds) -> tuple[str, str, str]:
    """A convergence record's table cells: steps to target (median [min-max] over the
    seeds), time to target (`seconds` formats it) with the seeds' spread, samples."""
    runs = conv.get("runs") or []
    if conv.get("reached"):
        steps = [x["steps_to_target"] for x in runs]
        lo, hi = conv["time_spread_s"]
        return (f"{statistics.median(steps):g} [{min(steps)}–{max(steps)}]",
                f"**{seconds(conv['time_to_target_s'])}** [{lo:.1f}–{hi:.1f}]",
                f"{conv['samples_to_target']:g}")
    missed = [x for x in runs if not x["reached"]]
    return (f"missed by {len(missed)} of {len(runs)} seeds",
            f"not reached (best loss {conv.get('best_val_loss', float('nan')):.3f})", "—")


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} s"


def table(records: list[dict]) -> str:
    best: dict[tuple[int, str], dict] = {}
    for r in records:
        conv = (r.get("metrics") or {}).get("convergence")
        if not conv:
            continue
        key = (conv["global_batch"], conv["optimizer"])
        t = conv.get("time_to_target_s") or float("inf")
        if key not in best or t < (best[key]["metrics"]["convergence"].get("time_to_target_s")
                                   or float("inf")):
            best[key] = r
    lines = ["| global batch | optimizer | lr (scaled) | micro-batch | step time | steps to "
             "target, median [min–max] | samples to target | time to target, median "
             "[min–max over seeds] | busy |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for (batch, opt), r in sorted(best.items()):
        conv = r["metrics"]["convergence"]
        runs = conv["runs"]
        lr = runs[0].get("lr")
        seen = _seen(r)
        busy = f"others {seen.get('other_cpu_share', 0):.0%}" if seen.get("flagged") else ""
        cell_steps, cell_time, samples = convergence_cells(conv, _s)
        lines.append(f"| {batch} | {opt} | {lr:.3g} | {r['plan']['micro_batch_size']} | "
                     f"{conv['step_time_s'] * 1000:.1f} ms | {cell_steps} | {samples} | "
                     f"{cell_time} | {busy} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-batch", type=int, default=0,
                   help="leave out global batches above this (0: none)")
    p.add_argument("--batches", default="",
                   help="run (and tabulate) only these global batches, e.g. 512 or 16,512")
    p.add_argument("--seeds", default="", help="these seeds instead of the study's, e.g. 0,1")
    p.add_argument("--timeout", default="",
                   help="each trial's limit in seconds instead of the study's trial_timeout")
    p.add_argument("study")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--remeasure", type=int, default=REMEASURE,
                   help="times a trial measured on a busy machine is measured again")
    args = p.parse_args()
    only = {int(b) for b in args.batches.split(",") if b.strip()}
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    records = run_all(args.study, args.out, args.remeasure, args.max_batch, only, seeds,
                      args.timeout)
    text = table(records)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
