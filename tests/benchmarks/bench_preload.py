"""The rank server's preload alone, before and after training_harness.measure.rank_preload: the
same modules imported with the garbage collector on (as the server did) and paused.

    python tests/benchmarks/bench_preload.py --rounds 8

Each round runs both in new interpreters, one after the other (their order
alternating), and reports the import's CPU time (time.process_time: what the
import itself costs, which a busy machine inflates far less than the wall clock)
and its wall clock, with the 1-minute load average. Prints median [min, max].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

IMPORT = """
import json, sys, time
c, w = time.process_time(), time.monotonic()
if sys.argv[1] == "collector on":
    import torch, torch._dynamo, strategies, training_harness.measure.rank_main,
    training_harness.measure.trial_loop
else:
    import training_harness.measure.rank_preload
print(json.dumps({"cpu": time.process_time() - c, "wall": time.monotonic() - w}))
"""


def once(variant: str) -> dict[str, float]:
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-c", IMPORT, variant], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=True)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": load}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    variants = ["collector on", "collector paused (rank_preload)"]
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else reversed(variants):
            rows[v].append(once(v))
            got = rows[v][-1]
            print(f"round {r + 1} {v}: cpu {got['cpu']:.2f} wall {got['wall']:.2f} "
                  f"load {got['load']:.2f}", file=sys.stderr, flush=True)
    print("| preload | CPU time (s) | wall clock (s) | load (1 min) |\n| --- | --- | --- | --- |")
    for v, runs in rows.items():
        print(f"| {v} | " + " | ".join(summary([x[k] for x in runs])
                                       for k in ("cpu", "wall", "load")) + " |")
    on, off = ([x["cpu"] for x in rows[v]] for v in variants)
    print(f"\nCPU time paused / on, per round: "
          f"{summary([b / a for a, b in zip(on, off, strict=True)])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
