"""`harness`: the command line. A user's mistake prints one line and exits with 2."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError, one_line


def _value(text: str) -> Any:
    """A flag value as TOML reads it (4 -> int, true -> bool); else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _pairs(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise HarnessError(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} layers=4")
        out[key.strip()] = _value(val.strip())
    return out


def _strategy_flag(text: str) -> tuple[str, dict[str, Any]]:
    """`amp` or `amp:dtype=bf16,init_scale=1024`."""
    name, _, rest = text.partition(":")
    settings = _pairs([p for p in rest.split(",") if p], "--strategy") if rest else {}
    return name.strip(), settings


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", nargs="?", help="plan file (TOML); flags below override it")
    g = p.add_argument_group("plan flags")
    g.add_argument("--workload", help="gpt, vit, resnet, mlp, or package.module:function")
    g.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload argument (repeatable), e.g. --arg layers=4")
    g.add_argument("--strategy", action="append", default=[], metavar="NAME[:K=V,...]",
                   help="enable a strategy with settings (repeatable), "
                        "e.g. --strategy amp:dtype=bf16")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"])
    g.add_argument("--micro-batch-size", type=int)
    g.add_argument("--global-batch-size", type=int)
    g.add_argument("--steps", type=int)
    g.add_argument("--warmup-steps", type=int)
    g.add_argument("--seed", type=int)


def plan_from_args(args: argparse.Namespace):
    from training_harness.core.config import read_toml
    from training_harness.core.plan import Plan

    data: dict[str, Any] = read_toml(args.plan) if args.plan else {}
    where = args.plan or "command line"
    if args.workload:
        data["workload"] = {"name": args.workload}
    if args.arg:
        wl = data.get("workload") or {"name": "gpt"}
        if isinstance(wl, str):
            wl = {"name": wl}
        data["workload"] = {**wl, **_pairs(args.arg, "--arg")}
    for text in args.strategy:
        name, settings = _strategy_flag(text)
        data.setdefault("strategies", {})[name] = settings
    flags = ("device", "micro_batch_size", "global_batch_size", "steps", "warmup_steps", "seed")
    for flag in flags:
        if getattr(args, flag) is not None:
            data[flag] = getattr(args, flag)
    if getattr(args, "timeout", None) is not None:
        data["timeout_s"] = args.timeout
    if getattr(args, "save", None):
        data["save"] = str(Path(args.save).expanduser().resolve())
    return Plan.from_dict(data, where=where)


def cmd_bench(args: argparse.Namespace) -> int:
    """One plan, as a study's trial runs: prepared by the torch-side helper, launched by the
    launcher its cluster names (training_harness.launch.run)."""
    import dataclasses

    from training_harness.cli.bench_phases import BenchPhases, phases_table
    from training_harness.cli.bench_table import estimate_table, result_table
    from training_harness.core.cluster import ClusterSpec
    from training_harness.launch.run import Nodes, bench_command, run_plan

    phases = BenchPhases(_PYTHON_S, _MAIN_AT)
    phases.lap("cli")
    plan = plan_from_args(args)
    phases.lap("plan")
    cluster = plan.cluster
    if args.launcher:
        cluster = dataclasses.replace(cluster or ClusterSpec(), launcher=args.launcher)
    nodes = Nodes(args.nnodes, args.node_rank, args.rdzv_endpoint)
    out = Path(args.out or f"runs/bench/{plan.name}-{datetime.now():%Y%m%d-%H%M%S}")
    command = bench_command(out, nodes, args.launcher,
                            on_slurm=cluster is not None and cluster.launcher == "slurm")

    def starting(prepared) -> None:  # checked, and Slurm would take it: nothing is refused now
        print(f"bench {plan.name}: {plan.workload}, {plan.world_size} rank(s) on "
              f"{args.nnodes} node(s), micro-batch {plan.micro_batch_size}, global batch "
              f"{plan.batch_size}, strategies: {', '.join(plan.strategies) or 'none'}",
              flush=True)
        phases.lap("launch")  # the launcher's share: `launched` adds the launch to it

    result = run_plan(plan, out, command, cluster, nodes, phases=phases, starting=starting)
    if args.node_rank != 0:
        print(f"{result.status}: {result.reason}")
        return 0
    # Where the command's time went, in the record too (keys added, none renamed).
    result.metrics["phases_s"] = phases.launched(result.metrics)
    if (out / "result.json").exists():
        result.write(out / "result.json")
    record = result.to_dict()
    print(result_table(record))
    if args.verbose and record.get("predicted"):
        print("predicted:\n" + estimate_table(record["predicted"]))
    if args.verbose:
        phases.lap("record")
        window = (record["metrics"].get("window") or {}).get("seconds")
        print("where the time went:\n"
              + phases_table({**record["metrics"]["phases_s"], **phases.seconds}, window))
    if record["metrics"].get("saved"):
        print(f"saved the trained weights to {record['metrics']['saved']} (a distillation "
              "teacher: [strategies.distill] teacher = that folder)")
    print(f"wrote {out / 'result.json'} (logs in {out / 'logs'})\nre-run: {command}")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from training_harness.cli.bench_table import estimate_table
    from training_harness.measure.prepare import prepare

    if args.target:  # a GPU this machine need not have: training_harness.cli.plan
        from training_harness.cli.plan import estimate_on_target

        return estimate_on_target(args, plan_from_args(args))
    prep = prepare(plan_from_args(args))
    if args.json:
        print(json.dumps(prep.predicted, indent=2))
    else:
        plan = prep.plan
        print(f"estimate {plan.name}: {plan.workload} on {prep.runtime.device_name}, "
              f"micro-batch {plan.micro_batch_size}, global batch {plan.batch_size}")
        print(estimate_table(prep.predicted))
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    from training_harness.cli.registry_view import strategies_json, strategies_text

    print(json.dumps(strategies_json(), indent=2) if args.json else strategies_text())
    return 0


EXAMPLES = """examples:
  harness tune --budget 5m                        the default study for this device
  harness bench studies/plans/amp-bf16.toml       one configuration, measured
  harness report runs/quickstart                  the study's HTML page"""


def build_parser() -> argparse.ArgumentParser:
    from training_harness import __version__

    parser = argparse.ArgumentParser(
        prog="harness",
        description="Benchmark and auto-tune training acceleration techniques.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from training_harness.cli.tune import add_tune_parser  # `tune` first: the main job
    add_tune_parser(sub)

    bench = sub.add_parser("bench", help="run one plan and measure it honestly")
    add_plan_flags(bench)
    bench.add_argument("--out", help="folder for result.json and plan.toml")
    bench.add_argument("-v", "--verbose", action="store_true",
                       help="print the estimate's breakdown, and where the command's "
                            "time went (also in the record: metrics.phases_s)")
    bench.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="stop the trial after this long (default: the plan's timeout_s)")
    bench.add_argument("--save", metavar="FOLDER",
                       help="write the trained weights and the workload there after the "
                            "measured steps (a distillation teacher, a fine-tuning's start)")
    bench.add_argument("--launcher", choices=["local", "slurm"],
                       help="where the trial runs: this machine, or a Slurm job through "
                            "submitit (default: the plan's cluster.launcher, else local)")
    nodes = bench.add_argument_group("several nodes (run the same command on each)")
    nodes.add_argument("--nnodes", type=int, default=1, help="how many nodes the trial spans")
    nodes.add_argument("--node-rank", type=int, default=0,
                       help="this node's index; node 0 writes the record")
    nodes.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                       help="torchrun's rendezvous: node 0's address and a free port")
    bench.set_defaults(func=cmd_bench)

    est = sub.add_parser("estimate", help="predicted memory and step time; nothing is run")
    add_plan_flags(est)
    est.add_argument("--json", action="store_true")
    from training_harness.cli.plan import add_plan_parser, add_target_flags  # `plan`, `--target`
    add_target_flags(est, "GPUs of the target (default: the plan's world size)")
    est.set_defaults(func=cmd_estimate)

    strat = sub.add_parser("strategies", help="the registry: techniques, settings, requirements")
    strat.add_argument("--json", action="store_true", help="machine-readable output")
    strat.set_defaults(func=cmd_strategies)

    add_plan_parser(sub)

    from training_harness.reports.cli import add_commands  # `report`, `compare`: HTML pages
    add_commands(sub)

    from training_harness.cli.selftest import add_selftest_parser  # `selftest --gpu`: the GPU path
    add_selftest_parser(sub)

    from training_harness.cli.calibrate import add_calibrate_parser  # the device's profile
    add_calibrate_parser(sub)

    from training_harness.cli.export import add_export_parsers  # `export`, `verify`
    add_export_parsers(sub)
    return parser


_PYTHON_S: float | None = None  # the interpreter's start and the imports, run as a command
_MAIN_AT: float | None = None  # when main() began (time.monotonic())


def main(argv: list[str] | None = None) -> int:
    import time

    global _PYTHON_S, _MAIN_AT
    _MAIN_AT = time.monotonic()
    if argv is None:  # the command line: this process was started to run it
        from training_harness.core.clock import process_age_s

        _PYTHON_S = process_age_s()
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on a bad flag
    from training_harness.core import versions

    try:
        versions.check_core()  # a dependency missing or outside the range tested
        return args.func(args)
    except HarnessError as e:
        print(f"harness {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except ImportError as e:  # drift: said in one line where a dependency is out of range
        if (why := versions.explain(e)) is None:
            raise
        print(f"harness {args.command}: error: {one_line(why)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
