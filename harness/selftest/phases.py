"""The selftest's phases, each step a subprocess (see runner.py) under the run's clock.

Each phase runs within its time box (proof.py): `Run.left()` is the time to the end of
the phase's box, or of the whole run if that comes first. A step still running at the
end is stopped; what did not fit is recorded with the reason. Each phase records what
it ran in the state as it goes, and `Run.save` rewrites selftest.json and the page
after every step, so a run stopped at any moment leaves what it measured.

selftest.json, in the out folder, holds the device, each run of the command (with where
each of its phases got: waiting, running, done or stopped), and what each phase ran
(its steps, what it skipped and why). A later run into the same folder with `--only`
replaces the phases it runs and keeps the others, so the page written at its end
covers every phase run so far:

    {"device": {...}, "rehearsal": bool,
     "runs": [{"command", "started_at", "wall_s", "phases", "progress": {phase: ...}}],
     "phases": {"tests": {"runs": [...]}, "bench": {"plans": [...]}, "tune": {...},
                "table": {...}}}
"""

from __future__ import annotations

import glob
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_harness.records.predicates import finished
from training_harness.records.run_store import write_atomic
from training_harness.selftest import proof
from training_harness.selftest.figures import read_json, read_jsonl
from training_harness.selftest.plans import plan_fit
from training_harness.selftest.runner import Step, run_logged

BENCH_LIMIT_S = 300.0  # one bench at most
BENCH_MARGIN_S = 15.0  # the bench's own start and record, beyond its trial's timeout
REHEARSAL_MARGIN_S = 5.0
MIN_STEP_S = 15.0  # a step is not started with less of its box left than this
MIN_REHEARSAL_STEP_S = 5.0
STATE_FILE = "selftest.json"


def load_state(out: Path) -> dict[str, Any]:
    data = read_json(out / STATE_FILE) or {}
    data.setdefault("runs", [])
    data.setdefault("phases", {})
    return data


def save_state(out: Path, state: dict[str, Any]) -> None:
    """Written atomically: a run stopped midway leaves the last whole state."""
    write_atomic(out / STATE_FILE, json.dumps(state, indent=2) + "\n")


@dataclass
class Run:
    out: Path
    deadline: float  # time.monotonic() by which the whole run should be done
    state: dict[str, Any]
    save: Callable[[], Any]  # writes the state and the page
    python: str = sys.executable
    echo: bool = True
    rehearse: bool = False  # on the CPU, tiny sizes (proof.py)
    root: Path = proof.ROOT  # the repository: steps run there (tests/, studies/)
    phase_end: float = math.inf  # the end of the running phase's box
    failed: list[str] = field(default_factory=list)

    def left(self) -> float:
        return min(self.deadline, self.phase_end) - time.monotonic()

    @property
    def min_step(self) -> float:
        return MIN_REHEARSAL_STEP_S if self.rehearse else MIN_STEP_S

    def step(self, argv: list[str], log: Path, timeout_s: float) -> Step:
        # a rehearsal proves the steps run, not their figures: busy figures are accepted
        # (a shared CPU is never quiet, and a busy trial would be measured again)
        env = {"HARNESS_QUIET_SHARE": "1"} if self.rehearse else None
        return run_logged(argv, log, timeout_s, root=self.out, echo=self.echo, cwd=self.root,
                          env=env)


def _out_of_box(run: Run) -> str:
    return (f"{OUT_OF_TIME}: {max(run.left(), 0):.0f} s left in this phase's box (a longer "
            "--time-limit gives it more)")


def run_tests(run: Run, suites: tuple[proof.Suite, ...]) -> bool:
    """Each pytest selection with a junit file, while its box has time."""
    entries: list[dict[str, Any]] = run.state["phases"].setdefault("tests", {"runs": []})["runs"]
    ok = True
    for suite in suites:
        if run.left() < run.min_step:
            entries.append({"name": suite.name, "skipped": _out_of_box(run)})
            ok = False
            run.save()
            continue
        junit = run.out / "tests" / f"{suite.name}.xml"
        junit.unlink(missing_ok=True)
        argv = [run.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                *proof.suite_args(suite, run.root, run.rehearse), f"--junitxml={junit}"]
        entry: dict[str, Any] = {"name": suite.name, "junit": str(junit.relative_to(run.out))}
        entries.append(entry)
        step = run.step(argv, run.out / "tests" / f"{suite.name}.log", run.left())
        entry["step"] = step.to_json()
        # pytest's 5: nothing selected (the rehearsal's `gpu` selection on a CPU)
        ok = ok and (step.ok or (step.rc == 5 and not step.timed_out))
        run.save()
    return ok


OUT_OF_TIME = "out of time"


def rest_plans(root: Path, state: dict[str, Any]) -> list[Path]:
    """The proof's plans its bench's box left out, then the plans of proof.REST_PLANS
    that the proof's own list leaves out."""
    core = {(root / p).resolve() for p in proof.CORE_PLANS}
    entries = (state["phases"].get("bench") or {}).get("plans") or []
    cut = [Path(e["plan"]) for e in entries
           if str(e.get("skipped", "")).startswith(OUT_OF_TIME)]
    found = sorted(Path(p) for p in glob.glob(str(root / proof.REST_PLANS)))
    return cut + [p for p in found if p.resolve() not in core]


def run_bench(run: Run, plans: list[Path], gpus: int, what: str) -> bool:
    """The device's profile (`harness calibrate`: the plans' estimates use it), then
    `harness bench` of each plan whose ranks per node fit the GPUs here, in order, while
    the box has time; the others are listed with the reason."""
    bench = run.state["phases"].setdefault("bench", {"pattern": what, "gpus": gpus,
                                                     "plans": []})
    ok = "profile" in bench or measure_profile(run, bench)
    entries: list[dict[str, Any]] = bench["plans"]
    dirs = {e["dir"].split("/")[-1] for e in entries if e.get("dir")}
    for path in plans:
        # a plan an earlier box left out, run now: its place on the page is taken
        entries[:] = [e for e in entries if not (e.get("plan") == str(path) and str(
            e.get("skipped", "")).startswith(OUT_OF_TIME))]
        fit = plan_fit(path, gpus)
        entry: dict[str, Any] = {"plan": str(path), "name": fit.name,
                                 "ranks_per_node": fit.ranks_per_node}
        entries.append(entry)
        if not fit.fits:
            entry["skipped"] = fit.reason
            continue
        if run.rehearse and (why := proof.cuda_only(path)):
            entry["skipped"] = f"not rehearsed on the CPU ({why})"
            continue
        if run.left() < run.min_step:
            entry["skipped"] = _out_of_box(run)
            continue
        stem = path.stem if path.stem not in dirs else f"{path.stem}-{len(dirs)}"
        dirs.add(stem)
        folder = run.out / "bench" / stem
        shutil.rmtree(folder, ignore_errors=True)  # no record from an earlier run stays
        limit = min(BENCH_LIMIT_S, run.left())
        margin = REHEARSAL_MARGIN_S if run.rehearse else BENCH_MARGIN_S
        flags = proof.rehearsal_flags(path) if run.rehearse else ["--device", "cuda"]
        argv = [run.python, "-m", "training_harness", "bench", str(path), *flags, "--out",
                str(folder),
                "--timeout", f"{max(limit - margin, 5):.0f}"]
        entry.update(dir=str(folder.relative_to(run.out)))
        step = run.step(argv, run.out / "bench" / f"{stem}.log", limit)
        entry["step"] = step.to_json()
        ok = ok and step.ok and (read_json(folder / "result.json") or {}).get("status") == "ok"
        run.save()
    run.save()
    return ok


PROFILE_LIMIT_S = 90.0  # `harness calibrate` on a GPU: about a minute


def measure_profile(run: Run, bench: dict[str, Any]) -> bool:
    """`harness calibrate` of the device into the machine's cache (the benches after it
    estimate with it) and into the out folder, before the plans it is judged on."""
    if run.left() < run.min_step:  # measured by a later call of the bench, if any
        return True
    entry: dict[str, Any] = {"file": "profile.json"}
    bench["profile"] = entry
    argv = [run.python, "-m", "training_harness", "calibrate", "--device",
            "cpu" if run.rehearse else "cuda", *(["--quick"] if run.rehearse else []),
            "--out", str(run.out / "profile.json")]
    step = run.step(argv, run.out / "profile.log", min(PROFILE_LIMIT_S, run.left()))
    entry["step"] = step.to_json()
    run.save()
    return step.ok


def run_tune(run: Run, study: Path, budget_s: float) -> bool:
    """`harness tune` of the study for the budget, less where its box is shorter."""
    folder = run.out / "tune"
    entry: dict[str, Any] = {"study": str(study), "dir": str(folder.relative_to(run.out))}
    run.state["phases"]["tune"] = entry
    timing = proof.REHEARSAL if run.rehearse else proof.GPU
    budget = min(budget_s, run.left() - timing.tune_overhead)
    least = timing.tune_min
    if budget < least:
        entry.clear()
        entry["skipped"] = (f"only {max(run.left(), 0):.0f} s left in its box; the tune "
                            f"needs {least + timing.tune_overhead:.0f} s at least "
                            "(run it alone: --only tune,report)")
        run.save()
        return False
    if budget < budget_s - 0.5:
        entry["note"] = (f"The budget was cut from {budget_s:.0f} s to {budget:.0f} s to end "
                         "within its box.")
    entry["budget_s"] = round(budget)
    shutil.rmtree(folder, ignore_errors=True)  # a new study, not a resumed one
    argv = [run.python, "-m", "training_harness", "tune", str(study), "--budget", f"{budget:.0f}s",
            "--out", str(folder), "--quiet"]
    run.save()
    step = run.step(argv, run.out / "tune.log", run.left())
    entry["step"] = step.to_json()
    run.save()
    trials = read_jsonl(folder / "trials.jsonl")
    return step.ok and any(t.get("status") == "ok" for t in trials)


def run_report(run: Run) -> bool:
    """`harness report` on the tune's run folder, into tune-report.html."""
    tune = run.state["phases"].get("tune") or {}
    folder = run.out / tune["dir"] if tune.get("dir") else None
    if folder is None or not (folder / "study.json").exists():
        tune["report"] = {"skipped": "the tune left no study.json to report on"}
        run.save()
        return False
    html = run.out / "tune-report.html"
    report = run.step([run.python, "-m", "training_harness", "report", str(folder), "--out",
                       str(html)],
                      run.out / "report.log", run.left())
    tune["report"] = {"html": str(html.relative_to(run.out)), "step": report.to_json()}
    run.save()
    return report.ok


TABLE_END_S = 60.0  # kept back after the table's study, for its last trial to stop


def run_table(run: Run, study: Path, folder: Path) -> bool:
    """Measure the table study's configurations (a grid, nothing cut short) into
    `folder` until the time limit: a folder that holds it already is resumed, so several
    GPU sessions add to one table."""
    entry: dict[str, Any] = {"study": str(study), "dir": str(folder)}
    run.state["phases"]["table"] = entry
    budget = run.left() - proof.GPU.tune_overhead - TABLE_END_S
    if budget < proof.GPU.tune_min:
        entry["skipped"] = f"only {max(run.left(), 0):.0f} s left within the time limit"
        run.save()
        return False
    before = read_jsonl(folder / "trials.jsonl")
    argv = [run.python, "-m", "training_harness", "tune", str(study), "--out", str(folder),
            "--budget", f"{budget:.0f}s", "--quiet"]
    if (folder / "study.json").exists():
        argv.append("--resume")
    step = run.step(argv, run.out / "table.log", budget + proof.GPU.tune_overhead + TABLE_END_S)
    trials = read_jsonl(folder / "trials.jsonl")
    # a record skipped for time or cut off measured nothing (a later session measures
    # its configuration): the page counts configurations measured, not records
    entry.update(step=step.to_json(), before=sum(map(finished, before)),
                 after=sum(map(finished, trials)), records=len(trials),
                 ok=sum(t.get("status") == "ok" for t in trials))
    run.save()
    return step.ok and len(trials) > len(before)
