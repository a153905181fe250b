"""One `harness tune` process: open the study, search, ablate, write the results.

The first process to create the Optuna study enqueues the references (the fp32
baseline, then the known-good configuration; every configuration for a grid), so
each study has them once. `--workers N` starts N-1 helpers after that, on the
same storage and deadline. After the search, one worker (the one holding the
study's ablation claim; --resume takes it over) runs the ablation and writes
best.toml; every main process writes study.json and prints the ranked table.

With a launcher whose trials run on other machines (Slurm), the main process first
has it check that they see the run folder (one line, exit 2, nothing made when
not), and waits for the jobs a stopped tuner left running before asking for more
(harness.tune.recovery.resume.jobs_left).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from functools import partial
from typing import Any

import optuna

from harness import __version__
from harness.core.errors import HarnessError
from harness.records.predicates import busy_note
from harness.records.run_store import RunFolderUnwritable, RunStore, write_atomic
from harness.records.tags import tags_of
from harness.tune.budget import Clock
from harness.tune.checked_study import CheckedStudy
from harness.tune.final.ablation import run_ablation
from harness.tune.final.confirmation import KEY as CONFIRMED
from harness.tune.final.confirmation import run_confirmation
from harness.tune.final.summary import (
    ablation_table,
    confirmation_text,
    now,
    status_counts,
    table,
    write_best,
)
from harness.tune.progress import Progress
from harness.tune.recovery.resume import StaleTrials, jobs_left, recover, rejoin, settle
from harness.tune.recovery.storage import (
    STORAGE_ENV,
    StorageUnreachable,
    describe_storage,
    make_storage,
)
from harness.tune.recovery.workers import Worker, spawn_helpers, wait_for
from harness.tune.search.first_guesses import estimated_start
from harness.tune.search.loop import Tuner
from harness.tune.search.sampling import make_sampler
from harness.tune.trial_job import TrialRunner
from harness.tune.tuner_state import TunerState


def run_session(args: argparse.Namespace, ready: CheckedStudy) -> int:
    import os

    # Taken out of the environment: the trials this process launches do not need it.
    from_env = os.environ.pop(STORAGE_ENV, None)
    args.storage = args.storage or from_env
    if args.follow:
        return _run_follower(args, ready)
    from harness.launch import local, rank_server

    # One-node trials' ranks are forked from the rank server: its imports overlap the
    # study's start.
    if ready.launcher is local.launch and ready.study.layout.nnodes == 1:
        rank_server.warm_up()
    study, store = ready.study, RunStore(ready.run_dir)
    main = not args.helper
    remote = args.storage and not args.storage.startswith("journal:")
    spec = study.storage
    storage = make_storage(args.storage, store.root, spec) if remote else None  # before mkdir
    if main and hasattr(ready.launcher, "check_shared"):  # trials on other machines
        note = ready.launcher.check_shared(store.root)  # HarnessError: before mkdir too
        if note:
            print(note, file=sys.stderr, flush=True)
    if main:
        if not store.exists():
            store.create(study.to_toml())
        else:
            write_atomic(store.study_toml, study.to_toml())
    storage = storage or make_storage(args.storage, store.root, spec)
    fixed = store.read_info().get("peaks")
    if fixed:  # resumed, or a helper worker: the MFU denominators the study started with
        ready.facts.peaks = fixed
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    size = ready.space.size()
    optuna_study, created = _open(storage, study, make_sampler(study, size))
    if created:
        _enqueue_references(optuna_study, ready, size)
    if args.helper:
        clock = Clock(time.time(), args.search_until, args.deadline_at)
    else:
        clock = Clock.start(study.budget.time_s, study.budget.ablation_share, ready.started)
    run = TrialRunner(study.name, store, ready.budget_bytes, ready.facts, ready.probe,
                   ready.launcher)
    if study.layout.nnodes > 1:
        import socket

        from harness.tune.recovery.follower import Announcer

        run.nodes = Announcer(optuna_study, args.rdzv_host or socket.gethostname(),
                              study.layout.nnodes)
    tuner = Tuner(TunerState(study, ready.space, optuna_study, storage, run, clock), settle,
                  reserve_final=not args.helper)
    if hasattr(storage, "on_stale"):  # RDB: record and retry what dead workers left
        storage.on_stale = StaleTrials(tuner.ctx)
    if main:
        _started(store, ready, clock, args.storage)

    helpers: list = []
    outcome = {"stopped": "interrupted", "ablation": "interrupted"}
    found = True
    try:
        with Progress(study.name, clock, quiet=args.quiet, store=store,
                      memory_budget=ready.budget_bytes) as progress:
            tuner.ctx.on_event = progress.event
            if hasattr(storage, "say") and not args.quiet:  # quiet: stderr still says
                storage.say = progress.line
            try:
                helpers = _search(args, ready, tuner, store, clock, progress, outcome)
                if main:
                    outcome["ablation"] = _ablation(args, optuna_study, tuner, progress)
            except StorageUnreachable as e:
                outcome["stopped"], outcome["ablation"] = str(e), "not run"
                raise
            except OSError as e:
                if not store.holds(e.filename):
                    raise
                outcome["stopped"], outcome["ablation"] = "the run folder cannot be written", \
                    "not run"
                raise RunFolderUnwritable(store, e) from None
    finally:  # also on Ctrl-C: helpers stopped, followers released, the study's files
        for p in helpers:
            if p.poll() is None:
                p.terminate()
        if run.nodes is not None:
            run.nodes.finished()
        if main:
            try:
                found = _finish(store, tuner, ready, clock,
                                f"{outcome['stopped']}; ablation: {outcome['ablation']}")
            except OSError as e:  # the folder went unwritable: the records are what's left
                print(f"could not write the study's summary: {e}", file=sys.stderr)
    return 0 if found else 1  # 1: nothing was tuned, every trial failed or did not fit


def _search(args: argparse.Namespace, ready: CheckedStudy, tuner: Tuner, store: RunStore,
            clock: Clock, progress: Progress, outcome: dict[str, str]) -> list:
    """Settle what a stopped tuner left, start the helpers, search; returns the helpers."""
    left = jobs_left(tuner.ctx)  # first: these are waited for, not failed by recover
    for note in recover(tuner.ctx):
        progress.line(note)
    helpers = []
    if len(ready.groups) > 1:
        # The storage URL goes through the environment: a password in argv shows in `ps`.
        env = {STORAGE_ENV: args.storage} if args.storage else {}
        helpers = spawn_helpers(_helper_argv(args, store, clock, ready), ready.groups,
                                store.root / "workers", env)
        progress.line(f"started {len(helpers)} helper worker(s); logs in {store.root / 'workers'}")
    _use_devices(ready.groups[0])
    try:
        outcome["stopped"] = tuner.search(first=[partial(rejoin, tuner.ctx, t) for t in left])
        progress.line(f"search ended: {outcome['stopped']}")
        if helpers:
            wait_for(helpers, clock.left() + 30)
    except BaseException:
        for p in helpers:
            p.terminate()
        raise
    return helpers


def _ablation(args: argparse.Namespace, optuna_study: optuna.Study, tuner: Tuner,
              progress: Progress) -> str:
    budget = tuner.ctx.study.budget
    if not budget.ablation_repeats and not budget.confirm_repeats:
        return "off (budget.ablation_repeats = 0)"
    if not _claim_ablation(optuna_study, tuner.ctx.me, take_over=args.resume):
        return "another worker runs it"
    if budget.confirm_repeats:
        progress.line("the contenders for the best measured again, in rounds")
        progress.line(f"confirmation: {run_confirmation(tuner.ctx)}")
    progress.line("ablation of the best configuration")
    return run_ablation(tuner.ctx)


def _run_follower(args: argparse.Namespace, ready: CheckedStudy) -> int:
    """On node K > 0: join the trials node 0's tuner launches (harness.tune.recovery.follower)."""
    from harness.tune.recovery.follower import follow

    study, store = ready.study, RunStore(ready.run_dir)
    storage = make_storage(args.storage, store.root, study.storage)
    store.root.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    clock = Clock.start(study.budget.time_s, 0.0, ready.started)
    optuna_study = None
    while optuna_study is None and clock.left() > 0:  # node 0's tuner may not have made it yet
        try:
            optuna_study = optuna.load_study(study_name=study.name, storage=storage)
        except KeyError:
            time.sleep(1.0)
    if optuna_study is None:
        raise HarnessError(f"no study '{study.name}' appeared in the storage within the budget")
    with Progress(f"{study.name} (node {args.node_rank})", clock, quiet=args.quiet) as progress:
        why = follow(optuna_study, store, args.node_rank, study.layout.nnodes, clock.deadline,
                     ready.launcher, say=progress.line)
        progress.line(f"follower ended: {why}")
    return 0


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


def _enqueue_references(optuna_study: optuna.Study, ready: CheckedStudy, size: int | None) -> None:
    for phase, params in ready.references:
        optuna_study.enqueue_trial(params, user_attrs={"phase": phase})
    if ready.study.sampler in ("auto", "tpe"):  # a grid or random search is the user's choice
        for params in estimated_start(ready, [p for _, p in ready.references]):
            optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})
    if ready.study.sampler == "grid":
        grid = ready.space.enumerate()
        random.Random(ready.study.seed).shuffle(grid)
        for params in grid:
            if all(params != p for _, p in ready.references):
                optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})


def _claim_ablation(optuna_study: optuna.Study, me: Worker, take_over: bool) -> bool:
    """Last writer wins, after a pause long enough for every claim to land."""
    owner = Worker.parse(optuna_study.user_attrs.get("ablation_owner"))
    if owner is not None and owner != me and owner.alive() and not take_over:
        return False
    optuna_study.set_user_attr("ablation_owner", me.tag)
    time.sleep(1.0)
    return optuna_study.user_attrs.get("ablation_owner") == me.tag


def _use_devices(group: str | None) -> None:
    import os

    if group is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = group  # this worker's trials' share


def _helper_argv(args: argparse.Namespace, store: RunStore, clock: Clock,
                 ready: CheckedStudy) -> list[str]:
    argv = [str(store.study_toml), "--out", str(store.root), "--helper",
            "--deadline-at", repr(clock.deadline), "--search-until", repr(clock.search_end),
            "--memory-budget", str(ready.budget_bytes)]
    return argv + (["--launcher", args.launcher] if args.launcher else [])


def _started(store: RunStore, ready: CheckedStudy, clock: Clock, storage: str | None) -> None:
    s = ready.study
    previous = store.read_info()
    sessions = previous.get("sessions", []) + [{"started_at": now(), "budget_s": clock.budget_s}]
    store.update_info(
        name=s.name, objective=s.objective, directions=s.directions,
        budget_s=clock.budget_s, memory_budget_bytes=ready.budget_bytes,
        device=ready.device_type, started_at=previous.get("started_at") or now(),
        finished_at=None, storage=describe_storage(storage, store.root),
        harness_version=__version__, best_trial_id=previous.get("best_trial_id"),
        baseline_trial_id=previous.get("baseline_trial_id"), n_trials=len(store.records()),
        stopped_because=None, sessions=sessions, peaks=ready.facts.peaks,
    )


def ready_decision(tuner: Tuner, best_id: Any) -> dict[str, Any] | None:
    """The confirmation's decision, when it named the trial that is the best now."""
    try:
        decision = tuner.ctx.optuna_study.user_attrs.get(CONFIRMED)
    except StorageUnreachable:
        return None
    return decision if decision and str(decision["best"]) == str(best_id) else None


def _finish(store: RunStore, tuner: Tuner, ready: CheckedStudy, clock: Clock, stopped: str) -> bool:
    """Write study.json (and best.toml), print the summary; False when nothing ran ok."""
    records = store.records()
    try:
        best = tuner.ctx.best_trial()
    except StorageUnreachable:
        best = None  # the records are all there is; --resume finishes the study
    best_id = best.user_attrs.get("trial_id", best.number) if best else None
    baseline = next((r for r in records if tags_of(r).get("phase") == "baseline"),
                    None)
    decision = ready_decision(tuner, best_id)
    rate = None
    if best is not None:
        if "throughput" in ready.study.objectives:
            rate = best.values[ready.study.objectives.index("throughput")]
            rate = decision["median"] if decision else rate
        write_best(store, ready.study.name, best_id, best.user_attrs["plan"], rate)
    store.update_info(
        finished_at=now(), best_trial_id=best_id,
        baseline_trial_id=baseline["trial_id"] if baseline else None,
        n_trials=len(records), stopped_because=stopped,
        wall_clock_s=round(clock.elapsed(), 1),
        calibration=tuner.ctx.calibration().as_dict(),
        best_by_repeats=decision,
    )
    multi = len(ready.study.objectives) > 1
    print(f"\nstudy {ready.study.name}: {len(records)} trials ({status_counts(records)}) in "
          f"{clock.elapsed():.0f} s of a {clock.budget_s:.0f} s budget; stopped: {stopped}")
    print(table(records, multi, memory_budget=ready.budget_bytes))
    if decision:
        print(confirmation_text(decision))
    else:
        base_rate = baseline and (baseline.get("metrics") or {}).get("samples_per_s")
        if rate and base_rate:
            print(f"best: trial {best_id}, {rate / base_rate:.2f}x the fp32 baseline "
                  f"(trial {baseline['trial_id']}; one measurement each)")
    if best_id is not None:
        text = ablation_table(records, best_id)
        if text:
            print(text)
        print(f"wrote {store.best_toml}; re-run it: harness bench {store.best_toml}")
    else:
        busy = [r for r in records if r["status"] == "ok" and busy_note(r)]
        if busy:
            print(f"{len(busy)} configuration(s) ran, each measured while other processes "
                  f"used the machine ({busy_note(busy[-1])}), so none is named best: run the "
                  "study on a quiet machine, or set HARNESS_QUIET_SHARE=1 to accept busy "
                  "figures (they stay marked in the records)", file=sys.stderr)
        print("no configuration ran within the budgets; nothing to write to best.toml "
              "(each record's reason says why)", file=sys.stderr)
    print(f"records: {store.trials_jsonl}")
    return best_id is not None
