"""`harness selftest --gpu`: the GPU path proved in one command (harness/selftest/).

This process never touches CUDA: it asks NVML and a short-lived torch child which
devices there are, and every phase runs as subprocesses with timeouts, so one failing
phase never stops the others. Exit code 0 when every phase run passed, 1 otherwise; 0
without a CUDA device (nothing is run); 2 for a mistake in the flags.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.units import parse_duration

WHAT = """\
harness selftest --gpu runs, on a machine with CUDA, in about 25 minutes on one H100:
  tests  python -m pytest -m gpu tests, and python -m pytest tests/kernels
  bench  harness bench of every plan under studies/plans/ whose ranks per node fit the
         CUDA devices here (the others are listed as skipped, with the reason)
  tune   harness tune studies/gpt2-small-1gpu.toml for 15 minutes, then harness report
and writes docs/benchmarks/gpu_<device>_<date>.md: the environment, each figure with its
spread, tuned over the fp32 baseline, MFU against the datasheet and the measured peak,
and the estimator's error. Logs and records go to runs/selftest-<date>/. Without CUDA it
says so and runs nothing."""

DEFAULT_PLANS = "studies/plans/*.toml"
DEFAULT_STUDY = "studies/gpt2-small-1gpu.toml"
TABLE_STUDY = "studies/gpt2-small-1gpu-table.toml"


def add_selftest_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="prove the GPU path: gpu tests, benches, a short tune",
                       description=WHAT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true",
                   help="the GPU selftest (required: the only one for now)")
    p.add_argument("--out", metavar="DIR",
                   help="logs, records and selftest.json (default runs/selftest-<date>); a "
                        "later run with --only into the same folder adds to its page")
    p.add_argument("--only", metavar="PHASES", default="tests,bench,tune",
                   help="a subset of tests,bench,tune (e.g. --only tests,bench), to split "
                        "the run into shorter ones; or table: measure the GPU table for the "
                        "search replay (every configuration of " + TABLE_STUDY + ") into "
                        "tests/benchmarks/tables/, resuming what earlier sessions measured")
    p.add_argument("--tune-budget", metavar="TIME", default="15m",
                   help="the study's wall clock (default 15m)")
    p.add_argument("--time-limit", metavar="TIME", default="25m",
                   help="the whole run (default 25m): benches that would not fit are "
                        "skipped, saying so")
    p.add_argument("--plans", metavar="GLOB", default=DEFAULT_PLANS,
                   help=f"the plans to bench (default {DEFAULT_PLANS})")
    p.add_argument("--study", default=DEFAULT_STUDY,
                   help=f"the study to tune (default {DEFAULT_STUDY})")
    p.add_argument("--doc", metavar="PATH",
                   help="the markdown page (default "
                        "docs/benchmarks/gpu_<device>_<YYYY-MM-DD>.md)")
    p.set_defaults(func=cmd_selftest)


def _phases(text: str) -> list[str]:
    from harness.selftest.state import PHASES

    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PHASES]
    if unknown or not asked:
        raise HarnessError(f"--only {text!r}: name phases among {','.join(PHASES)}, "
                           "e.g. --only tests,bench")
    return [p for p in PHASES if p in asked]


def _command(args: argparse.Namespace) -> str:
    """The command as run: `harness selftest --gpu` and the flags that differ from the
    defaults."""
    words = ["harness", "selftest", "--gpu"]
    defaults = {"out": None, "only": "tests,bench,tune", "tune_budget": "15m",
                "time_limit": "25m", "plans": DEFAULT_PLANS, "study": DEFAULT_STUDY,
                "doc": None}
    for key, default in defaults.items():
        if getattr(args, key) != default:
            words += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return shlex.join(words)


def cmd_selftest(args: argparse.Namespace) -> int:
    from harness.selftest.device import find_cuda
    from harness.selftest.plans import find_plans

    if not args.gpu:
        print(WHAT, file=sys.stderr)
        print("\nharness selftest: error: pass --gpu (the GPU selftest is the only one for "
              "now): harness selftest --gpu", file=sys.stderr)
        return 2
    phases = _phases(args.only)
    budget = parse_duration(args.tune_budget, "--tune-budget")
    limit = parse_duration(args.time_limit, "--time-limit")
    device, why = find_cuda()
    if device is None:
        print(f"harness selftest --gpu: no CUDA device here ({why}); nothing was run")
        return 0
    plans = find_plans(args.plans) if "bench" in phases else []
    if "bench" in phases and not plans:
        raise HarnessError(f"--plans {args.plans!r}: no .toml file matches")
    if "tune" in phases and not Path(args.study).is_file():
        raise HarnessError(f"--study {args.study}: no such file")
    return _run(args, phases, plans, budget, limit, device)


def _run(args: argparse.Namespace, phases: list[str], plans: list[Path], budget: float,
         limit: float, device) -> int:
    from harness.selftest import phases as ph
    from harness.selftest import state as st
    from harness.selftest.device import slug
    from harness.selftest.markdown import build

    start, now = time.monotonic(), datetime.now()
    date = f"{now:%Y-%m-%d}"
    out = Path(args.out or f"runs/selftest-{date}")
    doc = Path(args.doc or f"docs/benchmarks/gpu_{slug(device.name)}_{date}.md")
    state = st.load(out)
    state["device"] = device.to_json()
    record = {"command": _command(args), "started_at": f"{now:%Y-%m-%d %H:%M:%S}",
              "wall_s": 0.0, "phases": phases}
    state["runs"].append(record)
    for phase in phases:  # what this run does replaces what an earlier run left
        state["phases"].pop(phase, None)

    def save() -> None:
        record["wall_s"] = round(time.monotonic() - start, 1)
        st.save(out, state)

    run = ph.Run(out, start + limit, state, save)
    save()
    print(f"[selftest] {device.name} x {device.count}, driver {device.driver}, torch "
          f"{device.torch}, CUDA {device.cuda}; phases {','.join(phases)} within "
          f"{limit / 60:.0f} min; out {out}", flush=True)
    reserve = ph.tune_reserve(budget) if "tune" in phases else 0.0
    results: dict[str, bool] = {}
    try:
        if "tests" in phases:
            results["tests"] = ph.run_tests(run, reserve)
        if "bench" in phases:
            results["bench"] = ph.run_bench(run, plans, device.count, args.plans, reserve)
        if "tune" in phases:
            results["tune"] = ph.run_tune(run, Path(args.study), budget)
        if "table" in phases:
            folder = Path(f"tests/benchmarks/tables/gpt2-small-1gpu_{slug(device.name)}")
            results["table"] = ph.run_table(run, Path(TABLE_STUDY), folder)
    finally:
        save()
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(build(out, state, date), encoding="utf-8")
    for phase, ok in results.items():
        print(f"[selftest] {phase}: {'ok' if ok else 'FAILED'}")
    print(f"[selftest] wrote {doc} ({time.monotonic() - start:.0f} s; logs and records in "
          f"{out})")
    return 0 if all(results.values()) else 1
