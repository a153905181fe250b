"""One `harness tune` process: open the study, run it, finish it.

    open_study   the run folder and the Optuna study (the first process to create it
                 queues the references, then the estimator's first guesses, or the
                 whole grid), the clock, and the TunerState every stage shares
    run_study    what a stopped tuner left is settled (harness.tune.recovery), the
                 helper workers start (--workers N), the search runs
                 (harness.tune.search), then on the main worker the final phases
                 (harness.tune.final.phases)
    finish       helpers stopped, followers released; on the main worker study.json,
                 best.toml and the summary (harness.tune.final.results)

Node K > 0 of a multi-node study runs a follower instead (harness.tune.recovery.follower).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import optuna

from harness import __version__
from harness.core.errors import HarnessError
from harness.launch.slurm import SlurmLauncher
from harness.records.run_store import RunFolderUnwritable, RunStore, write_atomic
from harness.tune.budget import Clock
from harness.tune.checked_study import CheckedStudy
from harness.tune.final.phases import run_final_phases
from harness.tune.final.results import write_results
from harness.tune.final.summary import now
from harness.tune.progress import Progress
from harness.tune.recovery.follower import Announcer, run_follower
from harness.tune.recovery.resume import (
    StaleTrials,
    jobs_left,
    recover,
    rejoin,
    settle,
    wait_for_untagged,
)
from harness.tune.recovery.storage import (
    STORAGE_ENV,
    PatientStorage,
    StorageUnreachable,
    describe_storage,
    make_storage,
)
from harness.tune.recovery.torn import repair_records
from harness.tune.recovery.workers import spawn_helpers, wait_for
from harness.tune.search.correction import Corrections
from harness.tune.search.estimator_model import EstimatorCostModel, Predictions
from harness.tune.search.first_guesses import estimated_start, sample_size
from harness.tune.search.guided_sampler import GuidedSampler
from harness.tune.search.loop import Tuner
from harness.tune.search.sampling import make_sampler
from harness.tune.trial_job import TrialRunner
from harness.tune.tuner_state import TunerState


@dataclass
class Outcome:
    """How this process's study went, for study.json's `stopped_because`."""

    stopped: str = "interrupted"  # why the search ended
    final: str = "interrupted"  # how the final phases (the ablation last) ended
    helpers: list[subprocess.Popen] = field(default_factory=list)
    spent: dict[str, float] = field(default_factory=dict)  # seconds by phase, this session


def run_session(args: argparse.Namespace, checked: CheckedStudy) -> int:
    """0, or 1 when nothing was tuned (every trial failed or did not fit)."""
    # Taken out of the environment: the trials this process launches do not need it.
    from_env = os.environ.pop(STORAGE_ENV, None)
    args.storage = args.storage or from_env
    if args.follow:
        return run_follower(args, checked)
    try:
        tuner = open_study(args, checked)
    except OSError as e:  # study.toml or study.json not written: a full disk
        store = RunStore(checked.run_dir)
        if not RunFolderUnwritable.stops(store, e):
            raise
        raise RunFolderUnwritable(store, e) from None
    outcome = Outcome()
    try:
        run_study(args, checked, tuner, outcome)
    except BaseException:  # also on Ctrl-C: helpers stopped, followers released, the
        finish(args, tuner, outcome, stopping=True)  # study's files where they can be
        raise
    return 0 if finish(args, tuner, outcome) else 1


def open_study(args: argparse.Namespace, checked: CheckedStudy) -> Tuner:
    from harness.launch import local, rank_server

    # One-node trials' ranks are forked from the rank server: its imports overlap the
    # study's start.
    if isinstance(checked.launcher, local.LocalLauncher) and checked.study.layout.nnodes == 1:
        rank_server.warm_up()
    study, store = checked.study, RunStore(checked.run_dir)
    main = not args.helper
    remote = args.storage and not args.storage.startswith("journal:")
    storage = make_storage(args.storage, store.root, study.storage) if remote else None
    if main:  # before mkdir: trials on other machines must see the run folder
        note = checked.launcher.check_shared(store.root)  # HarnessError: nothing made
        if note:
            print(note, file=sys.stderr, flush=True)
        if not store.exists():
            store.create(study.to_toml())
        else:
            write_atomic(store.study_toml, study.to_toml())
    storage = storage or make_storage(args.storage, store.root, study.storage)
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
    if args.helper:  # the main worker's clock, so that every worker keeps the same reserve
        clock = Clock(time.time(), args.search_until, args.deadline_at)
    else:
        clock = Clock.start(study.budget.time_s, study.budget.ablation_share, checked.started)
    run = TrialRunner(study.name, store, checked.budget_bytes, checked.facts, checked.torch_helper,
                      checked.launcher)
    run.expandable_segments = study.budget.expandable_segments
    # Trials across nodes need a tuner on each node (followers), except a Slurm job's,
    # which spans its nodes itself.
    if study.layout.nnodes > 1 and not isinstance(checked.launcher, SlurmLauncher):
        import socket

        run.nodes = Announcer(optuna_study, args.rdzv_host or socket.gethostname(),
                              study.layout.nnodes)
    tuner = Tuner(TunerState(study, checked.space, optuna_study, storage, run, clock), settle)
    if isinstance(storage, PatientStorage):  # RDB: record and retry what dead workers left
        storage.on_stale = StaleTrials(tuner.ctx)
    if main:
        _started(store, checked, clock, args.storage)
    return tuner


def run_study(args: argparse.Namespace, checked: CheckedStudy, tuner: Tuner,
              outcome: Outcome) -> None:
    ctx = tuner.ctx
    store = ctx.run.store
    with Progress(ctx.study.name, ctx.clock, quiet=args.quiet, store=store,
                  memory_budget=checked.budget_bytes) as progress:
        ctx.on_event = progress.event
        if isinstance(ctx.storage, PatientStorage) and not args.quiet:  # quiet: stderr says
            ctx.storage.say = progress.line
        # A cut line of trials.jsonl is named whatever --quiet says: a record was lost.
        store.say = progress.line if not args.quiet else _stderr
        try:
            for note in repair_records(ctx):  # lines cut short: cut out, trials settled
                store.say(note)
            if args.resume:  # a tuner killed between Optuna's ask and its tag
                wait_for_untagged(ctx, progress.line)
            left = jobs_left(ctx)  # first: these are waited for, not failed by recover
            for note in recover(ctx):
                progress.line(note)
            outcome.helpers = _start_helpers(args, checked, ctx, progress.line)
            if checked.groups[0] is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = checked.groups[0]  # this worker's share
            began = time.time()
            outcome.stopped = tuner.search(first=[partial(rejoin, ctx, t) for t in left])
            progress.line(f"search ended: {outcome.stopped}")
            if outcome.helpers:
                wait_for(outcome.helpers, ctx.clock.left() + 30)
                for note in settle(ctx):  # a helper that died after this search ended
                    progress.line(note)
                if ctx.retries_waiting():  # its trial is owed a run
                    outcome.stopped = tuner.search()
            outcome.spent["search"] = time.time() - began
            if not args.helper:
                done = outcome.stopped.startswith(("converged", "search space exhausted"))
                outcome.final = run_final_phases(ctx, args.resume, progress.line, done,
                                                 outcome.spent)
        except StorageUnreachable as e:
            outcome.stopped, outcome.final = str(e), "not run"
            raise
        except OSError as e:
            if not RunFolderUnwritable.stops(store, e):
                raise
            outcome.stopped, outcome.final = "the run folder cannot be written", "not run"
            raise RunFolderUnwritable(store, e) from None


def finish(args: argparse.Namespace, tuner: Tuner, outcome: Outcome,
           stopping: bool = False) -> bool:
    """Stop the helpers, release the followers; the main worker writes the study's files.
    False when nothing ran ok. A run folder that takes no more writes (a full disk)
    raises RunFolderUnwritable (exit 3), unless the study is `stopping` on an error
    already (that error's line is the one the user gets)."""
    for p in outcome.helpers:
        if p.poll() is None:
            p.terminate()
    if tuner.ctx.run.nodes is not None:
        tuner.ctx.run.nodes.finished()
    if args.helper:
        return True
    store = tuner.ctx.run.store
    try:
        return write_results(tuner.ctx, f"{outcome.stopped}; ablation: {outcome.final}",
                             outcome.spent)
    except OSError as e:  # the folder went unwritable: the records are what's left
        if stopping:
            return True
        if not RunFolderUnwritable.stops(store, e):
            raise
        raise RunFolderUnwritable(store, e) from None


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
        grid = checked.space.enumerate()
        random.Random(checked.study.seed).shuffle(grid)
        for params in grid:
            if all(params != p for p in references):
                optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})


def _start_helpers(args: argparse.Namespace, checked: CheckedStudy, ctx: TunerState,
                   say: Any) -> list[subprocess.Popen]:
    """--workers N: N-1 helper processes on the same storage, deadline and reserve."""
    if len(checked.groups) <= 1:
        return []
    store, clock = ctx.run.store, ctx.clock
    argv = [str(store.study_toml), "--out", str(store.root), "--helper",
            "--deadline-at", repr(clock.deadline), "--search-until", repr(clock.search_end),
            "--memory-budget", str(checked.budget_bytes)]
    argv += ["--launcher", args.launcher] if args.launcher else []
    # The storage URL goes through the environment: a password in argv shows in `ps`.
    env = {STORAGE_ENV: args.storage} if args.storage else {}
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
