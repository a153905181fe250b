"""One `harness tune` process: open the study, run it, finish it.

    open_study   the run folder and the Optuna study (the first process to create it
                 queues the references, then the estimator's first guesses, or the
                 whole grid), the clock, and the parts each stage is given: the
                 Recorder, StudyTrials, Measured, the search's Tuner
    run_study    what a stopped tuner left is settled (training_harness.tune.recovery), the
                 helper workers start (--workers N), the search runs
                 (training_harness.tune.search), then on the main worker the final phases
                 (training_harness.tune.final.phases)
    finish       helpers stopped, followers released; on the main worker study.json,
                 best.toml and the summary (training_harness.tune.final.results)

Node K > 0 of a multi-node study runs a follower instead (training_harness.tune.recovery.follower).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import optuna

from training_harness import __version__
from training_harness.core.errors import HarnessError
from training_harness.launch.slurm import SlurmLauncher
from training_harness.records.run_store import RunFolderUnwritable, RunStore, write_atomic
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock
from training_harness.tune.checked_study import CheckedStudy
from training_harness.tune.final.extra_trial import ExtraTrials
from training_harness.tune.final.phases import run_final_phases
from training_harness.tune.final.results import write_results
from training_harness.tune.final.summary import now
from training_harness.tune.final.time_reserve import FinalTime
from training_harness.tune.model.correction import Corrections
from training_harness.tune.model.estimator_model import EstimatorCostModel, Predictions
from training_harness.tune.options import SessionOptions
from training_harness.tune.progress import Progress
from training_harness.tune.recorder import HeldTrials, Measured, Recorder, record_held
from training_harness.tune.recovery.follower import Announcer, run_follower
from training_harness.tune.recovery.grid_rest import requeue_grid, seeded_grid
from training_harness.tune.recovery.resume import (
    StaleTrials,
    cancel_jobs_left,
    jobs_left,
    recover,
    rejoin,
    repair_records,
    settle,
    wait_for_untagged,
)
from training_harness.tune.search.first_guesses import estimated_start, sample_size
from training_harness.tune.search.guided_sampler import GuidedSampler
from training_harness.tune.search.loop import Tuner
from training_harness.tune.search.sampling import make_sampler
from training_harness.tune.storage import (
    STORAGE_ENV,
    StorageHooks,
    StorageUnreachable,
    describe_storage,
    make_storage,
    say_stderr,
)
from training_harness.tune.study_trials import StudyTrials
from training_harness.tune.trial_job import TrialRunner
from training_harness.tune.workers import Worker, spawn_helpers, wait_for


@dataclass
class Outcome:
    """How this process's study went, for study.json's `stopped_because`."""

    stopped: str = "interrupted"  # why the search ended
    final: str = "interrupted"  # how the final phases (the ablation last) ended
    helpers: list[subprocess.Popen] = field(default_factory=list)
    spent: dict[str, float] = field(default_factory=dict)  # seconds by phase, this session


@dataclass
class Parts:
    """What open_study builds once. run_study and finish give each stage the parts it
    uses; nothing outside this module is given the whole."""

    study: Study
    space: SearchSpace
    optuna_study: optuna.Study
    run: TrialRunner
    clock: Clock
    progress: Progress
    on_event: Callable[[str, dict[str, Any]], None]
    recorder: Recorder
    trials: StudyTrials
    measured: Measured
    corrections: Corrections
    tuner: Tuner


def run_session(options: SessionOptions, checked: CheckedStudy) -> int:
    """0, or 1 when nothing was tuned (every trial failed or did not fit)."""
    # Taken out of the environment: the trials this process launches do not need it.
    from_env = os.environ.pop(STORAGE_ENV, None)
    options = replace(options, storage=options.storage or from_env)
    if options.follow:
        return run_follower(options, checked)
    try:
        parts = open_study(options, checked)
    except OSError as e:  # study.toml or study.json not written: a full disk
        store = RunStore(checked.run_dir)
        if not RunFolderUnwritable.stops(store, e):
            raise
        raise RunFolderUnwritable(store, e) from None
    outcome = Outcome()
    try:
        run_study(options, checked, parts, outcome)
    except BaseException:  # also on Ctrl-C: helpers stopped, followers released, the
        finish(options, parts, outcome, stopping=True)  # study's files where they can be
        raise
    return 0 if finish(options, parts, outcome) else 1


def open_study(options: SessionOptions, checked: CheckedStudy,
               on_event: Callable[[str, dict[str, Any]], None] | None = None) -> Parts:
    """`on_event`: what each trial's start, steps, end and notes are told to (the
    progress display's by default)."""
    study, main = checked.study, not options.helper
    if options.helper:  # the main worker's clock, so that every worker keeps the same reserve
        clock = Clock(time.time(), options.search_until, options.deadline_at)
    else:
        clock = Clock.start(study.budget.time_s, study.budget.ablation_share, checked.started)
    # A cut line of trials.jsonl is named whatever --quiet says (a record was lost). The
    # store says it through the progress display, which reads the store: the one made
    # first calls the other late.
    store = RunStore(checked.run_dir, say=say_stderr if options.quiet else
                     lambda text: progress.line(text))
    progress = Progress(study.name, clock, quiet=options.quiet, store=store,
                        defaults=checked.facts.defaults,
                        memory_budget=checked.budget_bytes)
    on_event = on_event or progress.event
    held, me = HeldTrials(), Worker.this()
    # RDB: the trials this worker holds, recorded if the database goes; dead workers'
    # trials recorded and retried
    hooks = StorageHooks({"worker": me.tag}, held.claimed,
                         partial(record_held, held, store, study.name),
                         StaleTrials(store, study.storage.retries, study.storage.grace, on_event))
    open_storage = partial(make_storage, options.storage, store.root, study.storage,
                           None if options.quiet else progress.line, hooks)
    remote = options.storage and not options.storage.startswith("journal:")
    storage = open_storage() if remote else None
    if main:  # before mkdir: trials on other machines must see the run folder
        note = checked.launcher.check_shared(store.root)  # HarnessError: nothing made
        if note:
            print(note, file=sys.stderr, flush=True)
        if not store.exists():
            store.create(study.to_toml())
        else:
            write_atomic(store.study_toml, study.to_toml())
    storage = storage or open_storage()
    fixed = store.read_info().get("peaks")
    if fixed:  # resumed, or a helper worker: the MFU denominators the study started with
        checked.facts.peaks = fixed
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    size = checked.space.size()
    predictions = Predictions(checked.space, checked.facts, checked.torch_helper)
    corrections = Corrections(store.records, checked.facts.device_type)
    sampler = make_sampler(study, size, EstimatorCostModel(
        checked.space, predictions, corrections, checked.budget_bytes, study.seed,
        sample_size(study.budget.time_s)))
    optuna_study, created = _open(storage, study, sampler)
    if created:
        _enqueue_first(optuna_study, checked, predictions)
    elif options.resume and study.sampler == "grid":
        queued = requeue_grid(optuna_study, checked.space.enumerate(), study.seed,
                              store.records())
        if queued:
            store.say(f"{queued} configuration(s) of the grid not yet measured (skipped for "
                      "time, or cut off at the deadline) queued again")
    # Trials across nodes need a tuner on each node (followers), except a Slurm job's,
    # which spans its nodes itself.
    nodes = None
    if study.layout.nnodes > 1 and not isinstance(checked.launcher, SlurmLauncher):
        import socket

        nodes = Announcer(optuna_study, options.rdzv_host or socket.gethostname(),
                          study.layout.nnodes)
    run = TrialRunner(study.name, store, checked.budget_bytes, checked.facts,
                      checked.torch_helper, checked.launcher, nodes=nodes,
                      expandable_segments=study.budget.expandable_segments)
    measured = Measured(study.objectives, checked.budget_bytes)
    for r in store.records():
        measured.remember(r)
    recorder = Recorder(store, storage, optuna_study, measured, held, me)
    trials = StudyTrials(optuna_study, study)
    tuner = Tuner(study, checked.space, optuna_study, run, clock, recorder, trials, measured,
                  corrections,
                  FinalTime(study, checked.space, clock, store, checked.budget_bytes, trials),
                  partial(settle, optuna_study, store, recorder, measured,
                          study.storage.retries), on_event)
    if main:
        _started(store, checked, clock, options.storage)
    return Parts(study, checked.space, optuna_study, run, clock, progress, on_event, recorder,
                 trials, measured, corrections, tuner)


def run_study(options: SessionOptions, checked: CheckedStudy, p: Parts,
              outcome: Outcome) -> None:
    store, retries = p.run.store, p.study.storage.retries
    with p.progress as progress:
        try:
            # lines cut short: cut out, trials settled
            for note in repair_records(store, p.optuna_study, p.measured, retries):
                store.say(note)
            if options.resume:  # a tuner killed between Optuna's ask and its tag
                wait_for_untagged(p.optuna_study, progress.line)
            # first: these are waited for, not failed by recover
            left = jobs_left(p.optuna_study, p.run, p.recorder)
            for note in cancel_jobs_left(p.optuna_study, p.run):  # theirs failed meanwhile
                progress.line(note)
            for note in recover(p.optuna_study, store, p.recorder, p.measured, retries):
                progress.line(note)
            outcome.helpers = _start_helpers(options, checked, store, p.clock, progress.line)
            if checked.groups[0] is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = checked.groups[0]  # this worker's share
            began = time.time()
            outcome.stopped = p.tuner.search(first=[
                partial(rejoin, p.run, p.clock.deadline, p.recorder, retries, p.on_event, t)
                for t in left])
            progress.line(f"search ended: {outcome.stopped}")
            if outcome.helpers:
                wait_for(outcome.helpers, p.clock.left() + 30)
                for note in p.tuner.settle():  # a helper that died after this search ended
                    progress.line(note)
                if p.trials.retries_waiting():  # its trial is owed a run
                    outcome.stopped = p.tuner.search()
            outcome.spent["search"] = time.time() - began
            if not options.helper:
                done = outcome.stopped.startswith(("converged", "search space exhausted"))
                outcome.final = run_final(p, options.resume, progress.line, done, outcome.spent)
        except StorageUnreachable as e:
            outcome.stopped, outcome.final = str(e), "not run"
            raise
        except OSError as e:
            if not RunFolderUnwritable.stops(store, e):
                raise
            outcome.stopped, outcome.final = "the run folder cannot be written", "not run"
            raise RunFolderUnwritable(store, e) from None


def run_final(p: Parts, take_over: bool, say: Callable[[str], None], search_done: bool,
              spent: dict[str, float] | None = None) -> str:
    """The final phases (training_harness.tune.final.phases), each given its parts."""
    extra = ExtraTrials(p.space, p.run, p.recorder, p.corrections, p.clock, p.on_event)
    return run_final_phases(p.study, p.space, p.run, p.clock, p.optuna_study, p.trials,
                            p.measured, extra, p.recorder.me, take_over, say, p.on_event,
                            search_done, spent)


def finish(options: SessionOptions, p: Parts, outcome: Outcome,
           stopping: bool = False) -> bool:
    """Stop the helpers, release the followers; the main worker writes the study's files.
    False when nothing ran ok. A run folder that takes no more writes (a full disk)
    raises RunFolderUnwritable (exit 3), unless the study is `stopping` on an error
    already (that error's line is the one the user gets)."""
    for helper in outcome.helpers:
        if helper.poll() is None:
            helper.terminate()
    if p.run.nodes is not None:
        p.run.nodes.finished()
    if options.helper:
        return True
    store = p.run.store
    try:
        return write_results(p.study, store, p.clock, p.trials, p.corrections,
                             p.run.budget_bytes, f"{outcome.stopped}; ablation: {outcome.final}",
                             outcome.spent)
    except OSError as e:  # the folder went unwritable: the records are what's left
        if stopping:
            return True
        if not RunFolderUnwritable.stops(store, e):
            raise
        raise RunFolderUnwritable(store, e) from None


def _open(storage: Any, study, sampler) -> tuple[optuna.Study, bool]:
    try:
        return optuna.create_study(study_name=study.name, storage=storage, sampler=sampler,
                                   directions=study.directions), True
    except optuna.exceptions.DuplicatedStudyError:
        loaded = optuna.load_study(study_name=study.name, storage=storage, sampler=sampler)
        have = [d.name.lower() for d in loaded.directions]
        if have != study.directions:
            raise HarnessError(f"the storage holds study '{study.name}' with directions {have}, "
                               f"not {study.directions}; give the study another name") from None
        return loaded, False


def _enqueue_first(optuna_study: optuna.Study, checked: CheckedStudy,
                   predictions: Predictions) -> None:
    """The references, then the estimator's first guesses (TPE without the GuidedSampler,
    which starts from them itself) or the whole grid."""
    references = [p for _, p in checked.references]
    for phase, params in checked.references:
        optuna_study.enqueue_trial(params, user_attrs={"phase": phase})
    if checked.study.sampler in ("auto", "tpe") and not isinstance(optuna_study.sampler,
                                                                   GuidedSampler):
        for params in estimated_start(checked, references, predictions):
            optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})
    if checked.study.sampler == "grid":
        for params in seeded_grid(checked.space.enumerate(), checked.study.seed):
            if all(params != p for p in references):
                optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})


def _start_helpers(options: SessionOptions, checked: CheckedStudy, store: RunStore,
                   clock: Clock, say: Any) -> list[subprocess.Popen]:
    """--workers N: N-1 helper processes on the same storage, deadline and reserve."""
    if len(checked.groups) <= 1:
        return []
    argv = [str(store.study_toml), "--out", str(store.root), "--helper",
            "--deadline-at", repr(clock.deadline), "--search-until", repr(clock.search_end),
            "--memory-budget", str(checked.budget_bytes)]
    argv += ["--launcher", options.launcher] if options.launcher else []
    # The storage URL goes through the environment: a password in argv shows in `ps`.
    env = {STORAGE_ENV: options.storage} if options.storage else {}
    helpers = spawn_helpers(argv, checked.groups, store.root / "workers", env)
    say(f"started {len(helpers)} helper worker(s); logs in {store.root / 'workers'}")
    return helpers


def _started(store: RunStore, checked: CheckedStudy, clock: Clock, storage: str | None) -> None:
    s = checked.study
    previous = store.read_info()
    sessions = previous.get("sessions", []) + [{"started_at": now(), "budget_s": clock.budget_s}]
    store.update_info(
        name=s.name, objective=s.objective, directions=s.directions,
        budget_s=clock.budget_s, memory_budget_bytes=checked.budget_bytes,
        device=checked.device_type, started_at=previous.get("started_at") or now(),
        finished_at=None, storage=describe_storage(storage, store.root),
        harness_version=__version__, best_trial_id=previous.get("best_trial_id"),
        baseline_trial_id=previous.get("baseline_trial_id"), n_trials=len(store.records()),
        stopped_because=None, sessions=sessions, peaks=checked.facts.peaks,
    )
