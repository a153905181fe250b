"""`harness selftest --gpu`: the GPU path proved in one command (harness/selftest/).

This process never touches CUDA: it asks NVML and a short-lived torch child which
devices there are, and every phase runs as subprocesses, each phase within its time box
(harness/selftest/proof.py), so one failing phase never stops the others. Exit code 0
when every phase run passed, 1 otherwise; 0 without a CUDA device (nothing is run); 2
for a mistake in the flags.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from training_harness.core.errors import HarnessError
from training_harness.core.units import parse_duration

WHAT = """\
harness selftest --gpu proves the GPU path in 9 minutes on one H100 or H200, each phase
stopped at its time box (--plan prints them):
  tests   pytest -m "gpu and not slow" (the files that mark gpu tests), pytest tests/kernels
  bench   the device's profile (harness calibrate), then harness bench of the plans that
          matter most: GPT-2 small bf16 + SDPA + fused AdamW at micro-batch 64, the same
          with fused linear cross-entropy, sliding-window attention, cuDNN SDPA, Flex-
          Attention, float8 and CUDA graphs; a 1B Llama with and without Liger; then
          selective checkpointing, quickstart, amp-bf16, fused, checkpoint, gpt-medium
  tune    harness tune studies/selftest/gpt2-small-tune.toml (about 3 minutes)
  report  harness report of the tune
  rest    with a longer --time-limit: the slow gpu tests, the plans the bench's box
          left out and the other plans
After every step it rewrites selftest.json in the out folder and the page
docs/benchmarks/gpu_<device>_<date>.md, which says which phases did not finish. Without
CUDA it says so and runs nothing; --rehearse runs the same phases on the CPU with tiny
sizes and a stand-in device name, within 2.5 minutes."""

TABLE_STUDY = "studies/gpt2-small-1gpu-table.toml"
REHEARSAL_DEVICE = "Rehearsal CPU"  # the stand-in device name of --rehearse


def table_folder(study: Path, device_name: str) -> Path:
    """Where the GPU table of `study` on this device is kept: named by the study, so a
    table study changed under a new name starts a table of its own."""
    import tomllib

    from training_harness.selftest.device import slug

    name = tomllib.loads(study.read_text())["name"]
    return study.parents[1] / "tests" / "benchmarks" / "tables" / f"{name}_{slug(device_name)}"


def add_selftest_parser(sub: argparse._SubParsersAction) -> None:
    from training_harness.selftest.proof import DEFAULT_PHASES, PHASES

    p = sub.add_parser("selftest", help="prove the GPU path: gpu tests, benches, a short tune",
                       description=WHAT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true",
                   help="the GPU selftest (required: the only one for now)")
    p.add_argument("--plan", action="store_true",
                   help="print the phases and their time boxes and exit (needs no GPU)")
    p.add_argument("--rehearse", action="store_true",
                   help="run the same phases on the CPU with tiny sizes and a stand-in "
                        "device name (2 minutes), into runs/selftest-rehearsal-<date>")
    p.add_argument("--out", metavar="DIR",
                   help="logs, records, selftest.json (default runs/selftest-<date>); a "
                        "later run with --only into the same folder adds to its page")
    p.add_argument("--only", metavar="PHASES", default=",".join(DEFAULT_PHASES),
                   help=f"a subset of {','.join(PHASES)} (default "
                        f"{','.join(DEFAULT_PHASES)}); table: measure the GPU table for the "
                        "search replay (every configuration of " + TABLE_STUDY + ") into "
                        "tests/benchmarks/tables/, resuming what earlier sessions measured")
    p.add_argument("--tune-budget", metavar="TIME",
                   help="the study's wall clock (default 150s; 20s rehearsed)")
    p.add_argument("--time-limit", metavar="TIME",
                   help="the whole run (default 8m; 2m rehearsed): a longer one adds the "
                        "rest, a shorter one shortens the tests' and benches' boxes")
    p.add_argument("--plans", metavar="GLOB",
                   help="bench these plans instead of the proof's own list")
    p.add_argument("--study", help="tune this study instead of the proof's own")
    p.add_argument("--doc", metavar="PATH",
                   help="the markdown page (default docs/benchmarks/gpu_<device>_<date>.md; "
                        "rehearsed: in the out folder)")
    p.set_defaults(func=cmd_selftest)


def _phases(text: str) -> list[str]:
    from training_harness.selftest.proof import PHASES

    asked = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PHASES]
    if unknown or not asked:
        raise HarnessError(f"--only {text!r}: name phases among {','.join(PHASES)}, "
                           "e.g. --only tests,bench")
    return [p for p in PHASES if p in asked]


def _command(args: argparse.Namespace) -> str:
    """The command as run: `harness selftest --gpu` and the flags that differ from the
    defaults."""
    from training_harness.selftest.proof import DEFAULT_PHASES

    words = ["harness", "selftest", "--gpu"] + (["--rehearse"] if args.rehearse else [])
    defaults = {"out": None, "only": ",".join(DEFAULT_PHASES), "tune_budget": None,
                "time_limit": None, "plans": None, "study": None, "doc": None}
    for key, default in defaults.items():
        if getattr(args, key) != default:
            words += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return shlex.join(words)


def cmd_selftest(args: argparse.Namespace) -> int:
    from training_harness.core import versions
    from training_harness.selftest import proof
    from training_harness.selftest.device import Device, find_cuda
    from training_harness.selftest.plans import find_plans

    if not args.gpu:
        print(WHAT, file=sys.stderr)
        print("\nharness selftest: error: pass --gpu (the GPU selftest is the only one for "
              "now): harness selftest --gpu", file=sys.stderr)
        return 2
    phases = _phases(args.only)
    timing = proof.REHEARSAL if args.rehearse else proof.GPU
    budget = (parse_duration(args.tune_budget, "--tune-budget") if args.tune_budget
              else timing.tune_budget)
    limit = (parse_duration(args.time_limit, "--time-limit") if args.time_limit
             else timing.time_limit)
    found = proof.boxes(phases, limit, budget, timing, args.rehearse)
    if args.plan:
        print(proof.plan_text(found, limit, timing))
        return 0
    # absolute: the steps run in the repository's root, whatever the folder here
    plans = ([p.resolve() for p in find_plans(args.plans)] if args.plans
             else [proof.ROOT / p for p in proof.CORE_PLANS])
    if "bench" in phases and not plans:
        raise HarnessError(f"--plans {args.plans!r}: no .toml file matches")
    study = (Path(args.study).resolve() if args.study else
             proof.ROOT / (proof.REHEARSAL_STUDY if args.rehearse else proof.GPU_STUDY))
    if "tune" in phases and not study.is_file():
        raise HarnessError(f"--study {args.study or study}: no such file")
    if args.rehearse:
        torch = versions.Declared("torch", "", None).installed()
        device = Device(count=1, name=REHEARSAL_DEVICE, torch=torch)
    else:
        device, why = find_cuda()
        if device is None:
            print(f"harness selftest --gpu: no CUDA device here ({why}); nothing was run")
            return 0
    return _run(args, phases, found, plans, study, budget, limit, device)


def _versions() -> list[list]:
    """[name, installed, range, extra] of every declared dependency, printed in one line."""
    from training_harness.core import versions

    found = [list(row) for row in versions.table()]
    said = ", ".join(f"{n} {v}" for n, v, _, _ in found if v)
    drift = versions.drift()
    print(f"versions: {said}; " + ("; ".join(drift) if drift else
                                   "all within the ranges the harness is tested with"))
    return found


def _stop_on_sigterm() -> None:
    """SIGTERM (a machine's or `timeout`'s stop) as Ctrl-C: the running step's processes
    are stopped, and the page says which phases did not finish."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _run(args: argparse.Namespace, phases: list[str], found, plans: list[Path], study: Path,
         budget: float, limit: float, device) -> int:
    from training_harness.selftest import phases as ph
    from training_harness.selftest import proof
    from training_harness.selftest.device import slug
    from training_harness.selftest.markdown import build

    start, now = time.monotonic(), datetime.now()
    date = f"{now:%Y-%m-%d}"
    default_out = f"runs/selftest-rehearsal-{date}" if args.rehearse else f"runs/selftest-{date}"
    out = Path(args.out or default_out).resolve()
    name = f"gpu_{slug(device.name)}_{date}.md"
    doc = Path(args.doc or (out / name if args.rehearse else Path("docs/benchmarks") / name))
    state = ph.load_state(out)
    state["device"] = device.to_json()
    state["versions"] = _versions()
    state["rehearsal"] = bool(args.rehearse)
    progress = {p: "waiting" for p in phases}
    record = {"command": _command(args), "started_at": f"{now:%Y-%m-%d %H:%M:%S}",
              "wall_s": 0.0, "phases": phases, "progress": progress,
              "boxes": {b.phase: b.seconds for b in found}}
    state["runs"].append(record)
    for phase in phases:  # what this run does replaces what an earlier run left
        state["phases"].pop(phase, None)
    if "tune" in phases or "report" in phases:
        (state["phases"].get("tune") or {}).pop("report", None)

    def save() -> None:
        record["wall_s"] = round(time.monotonic() - start, 1)
        ph.save_state(out, state)
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(build(out, state, date), encoding="utf-8")

    run = ph.Run(out, start + limit, state, save, rehearse=args.rehearse)
    _stop_on_sigterm()
    save()
    print(f"[selftest] {device.name} x {device.count}, driver {device.driver}, torch "
          f"{device.torch}, CUDA {device.cuda}; phases {','.join(phases)} within "
          f"{limit / 60:.1f} min; out {out}; page {doc}", flush=True)
    results: dict[str, bool] = {}
    runners = {
        "tests": lambda: ph.run_tests(run, proof.CORE_TESTS),
        "bench": lambda: ph.run_bench(run, plans, device.count, args.plans
                                      or f"the proof's {len(plans)} plans"),
        "tune": lambda: ph.run_tune(run, study, budget),
        "report": lambda: ph.run_report(run),
        "rest": lambda: _rest(run, device.count),
        "table": lambda: ph.run_table(run, proof.ROOT / TABLE_STUDY,
                                      table_folder(proof.ROOT / TABLE_STUDY, device.name)),
    }
    seconds = record["boxes"]
    end_s = (proof.REHEARSAL if args.rehearse else proof.GPU).end
    try:
        for i, phase in enumerate(phases):
            later = sum(seconds[p] for p in phases[i + 1:])
            run.phase_end = proof.phase_end(phase, time.monotonic(), seconds[phase],
                                            run.deadline, later, end_s)
            if phase in ("rest", "table") and run.left() < run.min_step:
                progress[phase] = "not in this run"
                continue
            progress[phase] = "running"
            save()
            results[phase] = runners[phase]()
            progress[phase] = "done"
    except KeyboardInterrupt:
        print("[selftest] stopped", flush=True)
        results["stopped"] = False
    finally:
        for phase, where in progress.items():
            if where == "running":
                progress[phase] = "stopped"
        save()
    for phase, ok in results.items():
        print(f"[selftest] {phase}: {'ok' if ok else 'FAILED'}")
    print(f"[selftest] wrote {doc} ({time.monotonic() - start:.0f} s; logs and records in "
          f"{out})")
    return 0 if all(results.values()) else 1


def _rest(run, gpus: int) -> bool:
    """The slow gpu tests, then the proof's plans the bench's box left out and the other
    single-GPU plans, while the box has time."""
    from training_harness.selftest import phases as ph
    from training_harness.selftest import proof

    ok = ph.run_tests(run, proof.REST_TESTS)
    plans = ph.rest_plans(run.root, run.state)
    if plans:
        ok = ph.run_bench(run, plans, gpus, "") and ok
    return ok
