"""The `report` and `compare` subcommands (harness/cli/main.py adds them with `add_commands`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="one self-contained HTML page for a study or bench run")
    rep.add_argument("run_dir", metavar="RUN_DIR",
                     help="a study folder (harness tune) or a bench folder (harness bench --out)")
    rep.add_argument("--out", metavar="FILE", help="the HTML file (default RUN_DIR/report.html)")
    rep.add_argument("--csv", nargs="?", const="", metavar="FILE",
                     help="also write the trial table as CSV (default: beside the HTML)")
    rep.add_argument("--json", nargs="?", const="", metavar="FILE",
                     help="also write the trial table as JSON (default: beside the HTML)")
    rep.set_defaults(func=cmd_report)

    cmp = sub.add_parser("compare", help="studies side by side in one HTML page")
    cmp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run folders")
    cmp.add_argument("--out", metavar="FILE",
                     help="the HTML file (default compare-<name>-<name>.html here)")
    cmp.set_defaults(func=cmd_compare)


def cmd_report(args: argparse.Namespace) -> int:
    from training_harness.reports.export import write_csv, write_json
    from training_harness.reports.load import load_run
    from training_harness.reports.report import build_report

    run = load_run(args.run_dir)
    for note in run.unreadable:  # a record cut short or kept aside: said here too
        print(note, file=sys.stderr)
    out = Path(args.out) if args.out else run.path / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_report(run), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): {len(run.trials)} trial(s) of "
          f"{run.name}")
    if args.csv is not None:
        print(f"wrote {write_csv(run, args.csv or out.with_suffix('.csv'))}")
    if args.json is not None:
        print(f"wrote {write_json(run, args.json or out.with_suffix('.json'))}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from training_harness.core.errors import HarnessError
    from training_harness.reports.compare import build_compare, ratio_lines
    from training_harness.reports.load import load_run

    if len(args.run_dirs) < 2:
        raise HarnessError("give two or more run folders to compare, e.g. "
                           "harness compare runs/a runs/b")
    runs = [load_run(p) for p in args.run_dirs]
    default = "compare-" + "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", r.name)[:40] for r in runs)
    out = Path(args.out or f"{default}.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build_compare(runs), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB): {len(runs)} runs")
    for line in ratio_lines(runs):
        print(line)
    return 0
