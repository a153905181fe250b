"""Benchmark (not a test): report generation time and file size for 10, 100 and 1,000 trials.

    python tests/reports/bench_report.py [--sizes 10 100 1000] [--rounds 3] [--out docs/benchmarks]

Each size is a synthetic study written as `harness tune` writes it (trials.jsonl, one
folder per trial, an Optuna journal) by tests/reports/runs.py. Timed: `harness report`'s
work in this process (read the records, build every figure, write the page), median and
range over rounds; then the page's load time in headless Chromium until every figure is
drawn, where Chromium is installed. Writes docs/benchmarks/reports-<date>.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.reports.chromium import BINARY, Chromium  # noqa: E402
from tests.reports.runs import synthetic_records, write_run  # noqa: E402
from training_harness.reports.compare import build_compare  # noqa: E402
from training_harness.reports.load import load_run  # noqa: E402
from training_harness.reports.report import build_report  # noqa: E402


def timed(fn, rounds: int) -> tuple[float, float, float, object]:
    times, out = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times), out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    args = ap.parse_args()
    rows, tmp = [], Path(tempfile.mkdtemp(prefix="bench-report-"))
    for n in args.sizes:
        run_dir = write_run(tmp / f"s{n}", synthetic_records(n, study=f"s{n}"))
        page = tmp / f"s{n}.html"

        def work(run_dir=run_dir, page=page):
            run = load_run(run_dir)
            page.write_text(build_report(run), encoding="utf-8")
            return run

        med, lo, hi, run = timed(work, args.rounds)
        t = time.perf_counter()  # the whole command, Python's start and imports included
        subprocess.run([sys.executable, "-m", "training_harness", "report", str(run_dir), "--out",
                        str(tmp / "cli.html")], cwd=ROOT, check=True, capture_output=True)
        cli = time.perf_counter() - t
        load = timed(lambda run_dir=run_dir: load_run(run_dir), args.rounds)[0]
        opened = None
        if BINARY:
            with Chromium() as browser:
                seen = browser.visit(page, settle=0)
                opened = browser.drawn_after
                assert seen.plots == seen.plot_divs and not seen.console_errors
        rows.append((n, len(run.trials), med, lo, hi, load, cli, page.stat().st_size, opened))
        print(f"{n:>5} trials: {med:.2f} s (load {load:.2f} s), "
              f"{page.stat().st_size / 2**20:.2f} MiB, opens in {opened or float('nan'):.2f} s")
    big = [load_run(tmp / f"s{args.sizes[-1]}")] * 2
    cmp = timed(lambda: build_compare(big), args.rounds)[0]
    write_markdown(Path(args.out), rows, cmp, args)


def write_markdown(out: Path, rows, cmp: float, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"reports-{date.today():%Y-%m-%d}.md"
    sizes = " ".join(map(str, args.sizes))
    lines = [
        f"# Report generation: time and file size ({date.today():%Y-%m-%d})", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPU(s) visible, {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}, pandas "
        f"{version('pandas')}, plotly {version('plotly')}, optuna {version('optuna')}"
        + (f"; {Path(BINARY).name} headless" if BINARY else "") + ".", "",
        f"Command: `python tests/reports/bench_report.py --sizes {sizes} --rounds {args.rounds}`",
        "", "Synthetic studies (tests/reports/runs.py: a toy performance model of amp, "
        "checkpoint, fused and lamb over four layouts and micro-batches 4-32, with pruned, "
        "out-of-memory and failed trials, then 3 leave-one-out repeats of the best), written "
        "as `harness tune` writes them, with an Optuna journal. *Generate* is what `harness "
        "report` does: read the records, compute effects and importances, build 8 figures, "
        f"write one HTML file, in a warm process; median [min-max] of {args.rounds} rounds. The "
        "whole command adds Python's start and the imports of pandas, plotly and optuna. "
        "*Open* is the time from Chromium's navigation to that file until every figure is "
        "drawn (one round; polled every 0.05 s).", "",
        "| trials asked | trials | generate (s) | of which reading records (s) | whole "
        "`harness report` command (s) | HTML size | open in Chromium (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, got, med, lo, hi, load, cli, size, opened in rows:
        lines.append(f"| {n} | {got} | {med:.2f} [{lo:.2f}-{hi:.2f}] | {load:.2f} | {cli:.2f} | "
                     f"{size / 2**20:.2f} MiB | {'-' if opened is None else f'{opened:.2f}'} |")
    lines += ["", f"`harness compare` of two {rows[-1][1]}-trial studies: {cmp:.2f} s.", "",
              "Of the file size, about 4.6 MiB is plotly.js itself, inlined once so that the page "
              "opens offline; the rest grows with the number of trials (figure data and the "
              "trial table).", ""]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
