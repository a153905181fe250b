"""The harness's own search, replayed against a surface: `harness tune`'s code, not a copy.

Once per surface, `prepare_study` runs training_harness.cli.tune.check (the study file, the
references with their largest fitting micro-batch, the memory budget) with the
torch-side helper answered in this process (world.SurfaceHelper) and a SurfaceLauncher.
Then per seed `run_seed` gives that CheckedStudy the seed (a copy of the study and its
SearchSpace), a fresh run folder, launcher and virtual clock, and calls
training_harness.tune.session.open_study (the run folder, the journal storage, the sampler, the
references and the estimator's first guesses queued by _enqueue_first, the study's
Clock, TrialRunner, Recorder, StudyTrials, Tuner) and Tuner.search, with training_harness.tune's
time on the
virtual clock (world.virtual_time). What is patched, and why:

    training_harness.launch.torch_helper.shared       -> the SurfaceHelper (check() asks it)
    SearchSpace.size (instance)              -> the size counted once per surface
    training_harness.core.interference.BusyWatch      -> never busy (the simulated machine is
                                                quiet; the real one reads this host's CPUs)
    time in training_harness.tune.*                   -> the virtual clock (world.virtual_time)

and, for one of Optuna's samplers in the harness's place (run_seed's `sampler`), only the
sampler (`sampler_swapped`):

    training_harness.tune.session.make_sampler        -> that sampler (not the GuidedSampler)
    training_harness.tune.session.estimated_start     -> no estimator's first guesses (they are
                                                the harness's search); the references (the fp32
                                                baseline, the known-good configuration) are the
                                                study's and still run first

and open_study's `on_event` (the tuner's callback, the progress display's by default) tallies each
trial's "end" record and raises StopReplay once the goal is reached and an hour has passed.
The search ends by its own rules (budget, convergence, exhausted space) or by StopReplay;
the final phases (confirmation, ablation) are not run: the named best is
StudyTrials.best_trial() when the search ends.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.benchmarks.surface_replay.launcher import SurfaceLauncher
from tests.benchmarks.surface_replay.world import SurfaceHelper, VirtualClock, virtual_time
from training_harness.records.tags import tags_of
from training_harness.study.search_space import SearchSpace
from training_harness.tune.checked_study import CheckedStudy
from training_harness.tune.options import SessionOptions

HOUR = 3600.0
EPOCH = 1.8e9  # where every seed's virtual clock starts


class StopReplay(Exception):
    """The replay has what it measures: the goal reached, and an hour gone."""


@dataclass
class Setup:
    checked: CheckedStudy
    helper: SurfaceHelper
    surface: Callable[[dict[str, Any], int], dict[str, Any]]
    truth: Callable[[dict[str, Any]], dict[str, Any]]
    size: int
    best: float  # the surface's best noise-free samples/s within the memory budget
    goal: float
    workdir: Path


@dataclass
class Run:
    """One seed's search."""

    reached_s: float | None = None  # simulated seconds to a measured config >= goal
    curve: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    launched: int = 0
    stopped: str = ""
    named: dict[str, Any] | None = None  # the tuner's best when it stopped
    final: str = ""  # how the final phases ended (a run with a budget of its own)
    elapsed_s: float = 0.0  # simulated seconds the run took
    censored_s: float | None = None  # stopped here short of the goal, for the replay's CPU

    def best_at(self, seconds: float) -> float:
        return max((b for t, b in self.curve if t <= seconds), default=0.0)


def within_budget(record: dict[str, Any], budget_bytes: int) -> bool:
    peak = (record.get("metrics") or {}).get("peak_memory_bytes")
    return record.get("status") == "ok" and peak is not None and peak <= budget_bytes


def prepare_study(study_file: Path, surface: Callable, workdir: Path) -> Setup:
    """Inside world.h100_world: the study checked as `harness tune` checks it. The
    caller sets the space's size, best and goal (others.enumerate_space)."""
    import training_harness.launch.torch_helper as torch_helper
    from training_harness.cli.tune import check

    clock = VirtualClock(EPOCH)
    helper = SurfaceHelper(clock)
    saved = torch_helper.shared
    torch_helper.shared = lambda: helper
    try:
        args = argparse.Namespace(
            workers=1, n_trials=None, budget=None, memory_budget=None, study=str(study_file),
            helper=False, resume=False, out=str(workdir / "check"), follow=False, node_rank=0,
            check=True, launcher=None, storage=None)
        checked = check(args, clock.now)
    finally:
        torch_helper.shared = saved
    return Setup(checked, helper, surface, surface.truth, 0, 0.0, 0.0, workdir)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def sampler_swapped(sampler: Any) -> Iterator[None]:
    """open_study makes the study with `sampler` in the harness's place and queues only the
    references; the Tuner's trial path (early stopping of slow trials, repeats reusing their
    record, the budget and its reserve) is unchanged."""
    import training_harness.tune.session as session

    with _patched(session, "make_sampler", lambda *args, **kwargs: sampler), \
            _patched(session, "estimated_start", lambda *args, **kwargs: []):
        yield


class _Never:
    def __call__(self) -> bool:
        return False


def run_seed(setup: Setup, seed: int, budget_s: float | None = None,
             sampler: Any = None, horizon_s: float | None = None) -> Run:
    """One seed's study. With `budget_s` the study runs whole within that budget, as
    `harness tune --budget` runs it (the search, then the final phases), and its named
    best is the one the confirmation rounds named; without, it stops once the goal is
    reached and an hour has passed (the cost to the goal is what is measured). With
    `sampler` (an Optuna sampler), that sampler searches in the harness's place. With
    `horizon_s`, a search not at the goal by then is stopped there (censored: its cost
    is more than that; a GP sampler's full day costs the replay half an hour of CPU)."""
    import training_harness.core.interference as interference
    import training_harness.tune.session as session

    clock = VirtualClock(EPOCH)
    setup.helper.clock = clock
    launcher = SurfaceLauncher(setup.surface, clock)
    study = copy.deepcopy(setup.checked.study)
    study.seed = seed
    if budget_s is not None:
        study.budget.time = budget_s
    space = SearchSpace(study, setup.checked.facts.device_type, setup.checked.facts.settings)
    space.size = lambda: setup.size  # counted once per surface (72,744 configurations: 1 s)
    run_dir = Path(tempfile.mkdtemp(prefix=f"seed{seed}-", dir=setup.workdir))
    checked = dataclasses.replace(setup.checked, study=study, space=space, run_dir=run_dir,
                                  launcher=launcher, torch_helper=setup.helper,
                                  started=clock.now)
    run = Run()
    budget = checked.budget_bytes

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind != "end":
            return
        elapsed = clock.now - checked.started
        if within_budget(data, budget) and "duplicate_of" not in tags_of(data):
            rate = setup.truth(data["plan"]).get("samples_per_s", 0.0)
            if rate > run.curve[-1][1]:
                run.curve.append((elapsed, rate))
            if rate >= setup.goal and run.reached_s is None:
                run.reached_s = elapsed
        if budget_s is None and run.reached_s is not None and elapsed >= HOUR:
            raise StopReplay
        if horizon_s is not None and run.reached_s is None and elapsed >= horizon_s:
            run.censored_s = horizon_s
            raise StopReplay

    options = SessionOptions(quiet=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(virtual_time(clock))
        stack.enter_context(_patched(interference, "BusyWatch", _Never))
        if sampler is not None:
            stack.enter_context(sampler_swapped(sampler))
        parts = session.open_study(options, checked, on_event=on_event)
        try:
            run.stopped = parts.tuner.search()
            if budget_s is not None:
                done = run.stopped.startswith(("converged", "search space exhausted"))
                run.final = session.run_final(parts, False, lambda text: None, done)
        except StopReplay:
            run.stopped = ("replay: goal reached, an hour gone" if run.censored_s is None
                           else f"replay: censored at {run.censored_s / HOUR:g} h")
        run.elapsed_s = clock.now - checked.started
        run.launched = len(launcher.launched)
        best = parts.trials.best_trial()
        if best is not None:
            plan = best.user_attrs.get("plan") or {}
            truth = setup.truth(plan)
            record = parts.run.store.records()
            mine = next((r for r in record if str(r.get("trial_id")) ==
                         str(best.user_attrs.get("trial_id", best.number))), {})
            run.named = {
                "share": truth.get("samples_per_s", 0.0) / setup.best,
                "measured_peak": (mine.get("metrics") or {}).get("peak_memory_bytes"),
                "true_peak": truth.get("peak_memory_bytes"),
                "over_measured": not within_budget(mine, budget) if mine else None,
                "over_true": (truth.get("peak_memory_bytes") or 0) > budget
                or truth.get("status") != "ok",
            }
    shutil.rmtree(run_dir, ignore_errors=True)
    return run
