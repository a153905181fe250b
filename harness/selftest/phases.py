"""The selftest's phases, each step a subprocess (see runner.py) under the run's clock.

The whole run has a time limit. Each phase keeps back what the phases after it need
(the tune's budget and its report), so a slow test suite or bench costs benches, which
are skipped with the reason, and not the tune. Each phase records what it ran in the
state (state.py) as it goes and says whether everything it ran passed.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.selftest.figures import read_json, read_jsonl
from harness.selftest.plans import plan_fit
from harness.selftest.runner import Step, run_logged

TEST_SUITES = {  # name -> (pytest arguments, its time limit in seconds)
    "gpu": (["-m", "gpu", "tests"], 600.0),
    "kernels": (["tests/kernels"], 420.0),
}
BENCH_LIMIT_S = 300.0  # one bench at most (the trial's own timeout is 60 s less)
BENCH_GUESS_S = 60.0  # what a bench is expected to take before one has run
# the tuner's budget counts from its command's start: this is the interpreter's start
# and the study's last records, beyond it
TUNE_STARTUP_S = 20.0
TUNE_MIN_S = 120.0  # a shorter study proves nothing
REPORT_LIMIT_S = 300.0
REPORT_KEEP_S = 45.0  # kept back for the report when planning the tune
MIN_STEP_S = 60.0  # a test suite is not started with less time than this


@dataclass
class Run:
    out: Path
    deadline: float  # time.monotonic() by which the whole run should be done
    state: dict[str, Any]
    save: Callable[[], Any]  # writes the state
    python: str = sys.executable
    echo: bool = True
    failed: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def step(self, argv: list[str], log: Path, timeout_s: float) -> Step:
        return run_logged(argv, log, timeout_s, root=self.out, echo=self.echo)

    def say(self, text: str) -> None:
        if self.echo:
            print(f"[selftest] {text}", flush=True)


def tune_reserve(budget_s: float) -> float:
    """The time the tune phase needs: its budget, the tuner's start and the report."""
    return budget_s + TUNE_STARTUP_S + REPORT_KEEP_S


def run_tests(run: Run, keep_s: float) -> bool:
    """pytest -m gpu over tests/, then tests/kernels, each with a junit file."""
    entries: list[dict[str, Any]] = []
    run.state["phases"]["tests"] = {"runs": entries}
    ok = True
    for name, (selection, limit) in TEST_SUITES.items():
        available = run.left() - keep_s
        if available < MIN_STEP_S:
            entries.append({"name": name, "skipped": f"only {max(available, 0):.0f} s left "
                            "within the time limit after what later phases need"})
            ok = False
            run.save()
            continue
        junit = run.out / "tests" / f"{name}.xml"
        junit.unlink(missing_ok=True)
        argv = [run.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection,
                f"--junitxml={junit}"]
        step = run.step(argv, run.out / "tests" / f"{name}.log", min(limit, available))
        entries.append({"name": name, "step": step.to_json(),
                        "junit": str(junit.relative_to(run.out))})
        ok = ok and step.ok
        run.save()
    return ok


def _bench_ok(folder: Path) -> bool:
    record = read_json(folder / "result.json")
    return bool(record) and record.get("status") == "ok"


def run_bench(run: Run, plans: list[Path], gpus: int, pattern: str, keep_s: float) -> bool:
    """`harness bench` of each plan whose ranks per node fit the GPUs here, while time
    is left; the others are listed with the reason."""
    entries: list[dict[str, Any]] = []
    run.state["phases"]["bench"] = {"pattern": pattern, "gpus": gpus, "plans": entries}
    ok, took, dirs = True, [], set()
    for path in plans:
        fit = plan_fit(path, gpus)
        entry: dict[str, Any] = {"plan": str(path), "name": fit.name,
                                 "ranks_per_node": fit.ranks_per_node}
        entries.append(entry)
        if not fit.fits:
            entry["skipped"] = fit.reason
            continue
        available = run.left() - keep_s
        expected = max(took) if took else BENCH_GUESS_S
        if available < expected:
            entry["skipped"] = (f"out of time: {max(available, 0):.0f} s left for benches "
                                f"within the time limit, a bench takes about {expected:.0f} s")
            continue
        stem = path.stem if path.stem not in dirs else f"{path.stem}-{len(dirs)}"
        dirs.add(stem)
        folder = run.out / "bench" / stem
        shutil.rmtree(folder, ignore_errors=True)  # no record from an earlier run stays
        limit = min(BENCH_LIMIT_S, available)
        argv = [run.python, "-m", "harness", "bench", str(path), "--device", "cuda",
                "--out", str(folder), "--timeout", f"{max(limit - 60, 30):.0f}"]
        step = run.step(argv, run.out / "bench" / f"{stem}.log", limit)
        took.append(step.seconds)
        entry.update(dir=str(folder.relative_to(run.out)), step=step.to_json())
        ok = ok and step.ok and _bench_ok(folder)
        run.save()
    run.save()
    return ok


def run_tune(run: Run, study: Path, budget_s: float) -> bool:
    """`harness tune` of the study for the budget (less if the time limit is near), then
    `harness report` on its run folder."""
    folder = run.out / "tune"
    entry: dict[str, Any] = {"study": str(study), "dir": str(folder.relative_to(run.out))}
    run.state["phases"]["tune"] = entry
    budget = min(budget_s, run.left() - TUNE_STARTUP_S - REPORT_KEEP_S)
    if budget < TUNE_MIN_S:
        entry.clear()
        entry["skipped"] = (f"only {max(run.left(), 0):.0f} s left within the time limit; "
                            f"the tune needs {TUNE_MIN_S + TUNE_STARTUP_S:.0f} s at least "
                            "(run it alone: --only tune)")
        run.save()
        return False
    if budget < budget_s:
        entry["note"] = (f"The budget was cut from {budget_s:.0f} s to {budget:.0f} s to end "
                         "within the time limit.")
    entry["budget_s"] = round(budget)
    shutil.rmtree(folder, ignore_errors=True)  # a new study, not a resumed one
    argv = [run.python, "-m", "harness", "tune", str(study), "--budget", f"{budget:.0f}s",
            "--out", str(folder)]
    step = run.step(argv, run.out / "tune.log", budget + TUNE_STARTUP_S + 240)
    entry["step"] = step.to_json()
    run.save()
    trials = read_jsonl(folder / "trials.jsonl")
    ok = step.ok and any(t.get("status") == "ok" for t in trials)
    if not (folder / "study.json").exists():
        return False
    html = run.out / "tune-report.html"
    report = run.step([run.python, "-m", "harness", "report", str(folder), "--out", str(html)],
                      run.out / "report.log", REPORT_LIMIT_S)
    entry["report"] = {"html": str(html.relative_to(run.out)), "step": report.to_json()}
    run.save()
    return ok and report.ok


TABLE_END_S = 60.0  # kept back after the table's study, for its last trial to stop


def run_table(run: Run, study: Path, folder: Path) -> bool:
    """Measure the table study's configurations (a grid, nothing cut short) into
    `folder` until the time limit: a folder that holds it already is resumed, so several
    GPU sessions add to one table."""
    entry: dict[str, Any] = {"study": str(study), "dir": str(folder)}
    run.state["phases"]["table"] = entry
    budget = run.left() - TUNE_STARTUP_S - TABLE_END_S
    if budget < TUNE_MIN_S:
        entry["skipped"] = f"only {max(run.left(), 0):.0f} s left within the time limit"
        run.save()
        return False
    before = len(read_jsonl(folder / "trials.jsonl"))
    argv = [run.python, "-m", "harness", "tune", str(study), "--out", str(folder),
            "--budget", f"{budget:.0f}s", "--quiet"]
    if (folder / "study.json").exists():
        argv.append("--resume")
    step = run.step(argv, run.out / "table.log", budget + TUNE_STARTUP_S + TABLE_END_S)
    trials = read_jsonl(folder / "trials.jsonl")
    entry.update(step=step.to_json(), before=before, after=len(trials),
                 ok=sum(t.get("status") == "ok" for t in trials))
    run.save()
    return step.ok and len(trials) > before
