"""Measure plan variants side by side in one run and print a markdown table of ratios.

    python tests/benchmarks/side_by_side.py studies/plans/quickstart.toml \
        --variant fp32= --variant bf16=amp:dtype=bf16 --variant "bf16+fused=amp:dtype=bf16;fused" \
        --rounds 3

Each trial runs in its own `harness bench` process, so one trial's allocator or RSS
cannot colour another's memory figure. Rounds are interleaved (A B C, A B C, ...)
so slow drift of a shared machine falls on every variant alike; a variant's figure
is the median over rounds of its median step time, and the spread is the range
over rounds. A ratio smaller than that spread is noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path


def parse_variant(text: str) -> tuple[str, list[str]]:
    """NAME=strategy;strategy adds strategies to the plan; NAME=@other.toml runs that plan."""
    name, _, spec = text.partition("=")
    if spec.startswith("@"):
        return name, [spec[1:]]
    flags = []
    for strategy in filter(None, spec.split(";")):
        flags += ["--strategy", strategy]
    return name, flags


def bench(plan: str, flags: list[str], out: Path) -> dict:
    if flags and flags[0].endswith(".toml"):  # a variant that is a plan of its own
        plan, flags = flags[0], flags[1:]
    cmd = [sys.executable, "-m", "training_harness", "bench", plan, *flags, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return json.loads((out / "result.json").read_text())


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+", help="plan files (each gets every variant)")
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=strategy[;strategy...], e.g. bf16=amp:dtype=bf16; "
                         "the first is the baseline")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flags", default="", help="extra flags for every run, e.g. '--steps 4'")
    args = ap.parse_args()
    variants = [(n, f + args.flags.split()) for n, f in map(parse_variant, args.variant)]
    tmp = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    print(f"<!-- {date.today()}; rounds={args.rounds}; command: python {' '.join(sys.argv)} -->")
    print("| plan | variant | samples/s | vs baseline | spread over rounds | MFU | "
          "peak MiB measured (RSS above start / allocator) | peak MiB predicted | loss last |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for plan in args.plans:
        runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
        for r in range(args.rounds):
            for name, flags in variants:
                runs[name].append(bench(plan, flags, tmp / f"{Path(plan).stem}-{name}-{r}"))
        base = None
        for name, _ in variants:
            recs = runs[name]
            ranks = recs[0]["plan"]["layout"]
            world = ranks["data"] * ranks["pipeline"] * ranks["tensor"]
            med = [x["metrics"]["step_time_s"]["median"] for x in recs]
            batch = recs[0]["plan"].get("global_batch_size") or recs[0]["plan"]["micro_batch_size"]
            sps = batch / statistics.median(med)
            base = base or sps
            spread = (max(med) - min(med)) / statistics.median(med)
            m = recs[-1]["metrics"]
            mem = m["memory"]
            measured = (mem["allocated"] if mem.get("allocated") is not None
                        else mem["rss"] - mem["rss_base"])
            print(f"| {Path(plan).stem} | {name} ({world} proc) | {sps:.2f} | {sps / base:.2f}x | "
                  f"±{50 * spread:.0f}% | {100 * m['mfu']:.1f}% | {mib(measured)} | "
                  f"{mib(recs[-1]['predicted']['peak_memory_bytes'])} | "
                  f"{m['loss']['last']:.3f} |")


if __name__ == "__main__":
    main()
