"""`harness tune`: its flags, and everything checked before anything is created.

    harness tune [STUDY] --budget 1d|6h|30m|90s --memory-budget 70GiB|0.9
                 --storage URL --out DIR --workers N --n-trials N --resume --check
    harness tune --keys                # every study-file key: type, default, meaning

A bad study file or flag is a HarnessError here: one line, exit 2, no run
folder made, nothing launched. training_harness.tune.session then runs the study
(`--check` stops after the checks and prints what would run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.units import parse_duration
from training_harness.tune.checked_study import CheckedStudy

MAX_WORKERS = 256  # tuner processes on one machine


def add_tune_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="search layouts, micro-batch sizes and techniques "
                                    "(Optuna) under a time and a memory budget")
    p.add_argument("study", nargs="?",
                   help="study file (TOML); default: the default study for this device")
    p.add_argument("--budget", metavar="TIME",
                   help="wall clock for the whole study: 90s, 30m, 6h, 1d (default: the "
                        "study's budget.time)")
    p.add_argument("--memory-budget", metavar="SIZE|FRACTION",
                   help="peak memory per device: a size (70GiB) or a fraction of the "
                        "device's memory (0.9)")
    p.add_argument("--storage", metavar="URL",  # training_harness.tune.storage.STORAGE_ENV
                   default=os.environ.get("HARNESS_STORAGE"),
                   help="Optuna storage shared by workers: an RDB URL (postgresql://...), "
                        "redis://..., or journal:PATH (default: $HARNESS_STORAGE, else "
                        "runs/<study>/optuna.journal); a password in it is never written")
    p.add_argument("--out", metavar="DIR", help="the run folder (default: runs/<study name>)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="tuners on this machine sharing the study (CUDA devices are split "
                        "between them; on a CPU they share the cores)")
    p.add_argument("--n-trials", type=int, metavar="N", help="search trials at most")
    p.add_argument("--resume", action="store_true",
                   help="continue the study in --out (or runs/<study name>)")
    p.add_argument("--launcher", metavar="local|slurm|MODULE:FUNCTION",
                   help="where trials run: this machine, Slurm jobs (the study's [cluster] "
                        "table), or your own function, written mypkg.mod:launch_trial, "
                        "that runs one prepared trial (docs/tuning.md, 'Your own "
                        "launcher') (default: the study's cluster.launcher, else local)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--keys", nargs="?", const="", metavar="SECTION",
                   help="print every key a study file may hold, or a section's (budget, "
                        "layout, ...): its type, default and meaning; then exit")
    p.add_argument("--check", action="store_true",
                   help="check the study file and the flags as a run would (device, search "
                        "space, references, run folder, launcher), print what would run and "
                        "exit 0; nothing is created or launched (exit 2 with the reason "
                        "otherwise)")
    nodes = p.add_argument_group("trials spanning several nodes (layout.nnodes > 1)")
    nodes.add_argument("--follow", action="store_true",
                       help="on a node other than 0: join each trial the tuner on node 0 "
                            "launches (needs --storage and --node-rank)")
    nodes.add_argument("--node-rank", type=int, default=0, help="this node's index")
    nodes.add_argument("--rdzv-host", metavar="HOST",
                       help="on node 0: the address the other nodes reach it at "
                            "(default: its host name)")
    # Set by `--workers N` for the helper processes it starts.
    p.add_argument("--helper", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--search-until", type=float, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    if args.keys is not None:
        from training_harness.study.keys import keys_text

        print(keys_text(args.keys or None), end="")
        return 0
    started = time.time()
    ready = check(args, started)
    if ready.space.left_out and not (args.check or args.helper or args.follow):  # once
        print("left out of the search space (the registry refuses them here):",
              *(f"  - {line}" for line in ready.space.left_out), sep="\n", file=sys.stderr)
    if args.check:
        from training_harness.cli.tune_check import what_would_run

        print(what_would_run(args, ready))
        return 0
    from training_harness.tune.options import SessionOptions
    from training_harness.tune.session import run_session

    options = SessionOptions(
        storage=args.storage, resume=args.resume, quiet=args.quiet, launcher=args.launcher,
        helper=args.helper, search_until=args.search_until, deadline_at=args.deadline_at,
        follow=args.follow, node_rank=args.node_rank, rdzv_host=args.rdzv_host)
    return run_session(options, ready)


def check(args: argparse.Namespace, started: float) -> CheckedStudy:
    """The study and the flags checked as a run would; nothing created or launched.

    What needs torch (the strategy registry, the device) is asked of the tuner's
    torch-side helper (training_harness.launch.torch_helper): this process never imports torch."""
    from training_harness.cli.tune_check import check_run_folder
    from training_harness.launch import rank_server
    from training_harness.launch.torch_helper import shared
    from training_harness.records.run_store import RunStore
    from training_harness.study.references import baseline, known_good
    from training_harness.study.search_space import NotInSpace, SearchSpace
    from training_harness.study.study_file import memory_spec
    from training_harness.tune.budget import memory_budget_bytes
    from training_harness.tune.model.estimator_model import largest_fitting_micro

    if not 1 <= args.workers <= MAX_WORKERS:
        raise HarnessError(f"--workers {args.workers}: must be between 1 and {MAX_WORKERS} "
                           "(each is a process)")
    if args.n_trials is not None and args.n_trials < 1:
        raise HarnessError(f"--n-trials {args.n_trials}: must be 1 or more")
    if args.budget is not None:
        parse_duration(args.budget, "--budget")
    if args.memory_budget is not None:
        memory_spec(args.memory_budget, "--memory-budget")

    probe = shared()
    study = _load_study(args, probe)
    # Before the helper starts its server (rank_server.warm_up); --check launches nothing.
    if _forks_trials(args.launcher, study) and not args.check:
        rank_server.warm_up()
    # Checked as the file says (the flags below change only the budget, which the
    # registry and the device have no say in).
    facts = probe.study_facts(study)
    budget = study.budget
    if args.budget is not None:
        budget.time = args.budget
    if args.memory_budget is not None:
        budget.memory = args.memory_budget
    if args.n_trials is not None:
        budget.n_trials = args.n_trials
    space = SearchSpace(study, facts.device_type, facts.settings)
    if study.sampler == "grid" and space.size() is None:
        raise HarnessError("sampler = 'grid' needs a space of choices only; give ranges as "
                           "lists in [strategies.<name>.values]")
    _check_nodes(args, study.layout.nnodes)
    references, given_micro = [], []
    for phase, wanted in (("baseline", baseline(space)), ("known-good", known_good(space))):
        try:
            references.append((phase, space.params_for(wanted)))
        except NotInSpace as e:
            raise HarnessError(f"{'known_good' if phase == 'known-good' else phase}: {e}; "
                               "it must be a configuration the study searches") from None
        given_micro.append(wanted.micro_batch_size is not None)
    if references[1][1] == references[0][1]:
        references.pop()
        given_micro.pop()

    default = study.name + (f"-node{args.node_rank}" if args.follow else "")
    run_dir = Path(args.out) if args.out else Path("runs") / default
    check_run_folder(run_dir, given=bool(args.out))  # first: a bad path breaks exists()
    store = RunStore(run_dir)
    if not args.follow:  # a follower keeps its node's logs only, and may start again
        if (args.resume or args.helper) and not store.exists():
            raise HarnessError(f"--resume: {run_dir} holds no study (no study.toml); "
                               "start it without --resume")
        # --check changes nothing: it says so in its "run folder" line instead
        if not (args.resume or args.helper or args.check) and store.exists():
            raise HarnessError(f"{run_dir} already holds study '{study.name}'; pass --resume "
                               "to continue it, or --out DIR to start a new one")
    launcher = _launcher(args.launcher, study, facts.device_type)
    groups: list[str | None] = [None]
    if args.workers > 1:
        from training_harness.tune.workers import device_groups

        cuda = facts.device_count if facts.device_type == "cuda" else 0
        groups = device_groups(args.workers, max(study.layout.world_sizes), cuda)
    budget_bytes = memory_budget_bytes(budget.memory, facts.device_memory_bytes)
    if budget_bytes < 1:
        key = "--memory-budget" if args.memory_budget is not None else "budget.memory"
        raise HarnessError(f"{key} {budget.memory!r}: is less than one byte of this device's "
                           "memory; give a size such as 8GiB, or a fraction such as 0.9")
    if not (args.resume or args.helper or args.follow):  # enqueued once, when it is created
        references = [(phase, params if fixed_micro else largest_fitting_micro(
            space, params, probe, facts, budget_bytes))
            for (phase, params), fixed_micro in zip(references, given_micro, strict=True)]
        if len(references) == 2 and references[1][1] == references[0][1]:
            references.pop()
    return CheckedStudy(study, space, facts, probe, run_dir, budget_bytes, references, launcher,
                      groups, started)


def _check_nodes(args: argparse.Namespace, nnodes: int) -> None:
    if nnodes == 1:
        if args.follow or args.node_rank:
            raise HarnessError("--follow and --node-rank are for studies with layout.nnodes > 1")
        return
    if args.workers > 1:
        raise HarnessError(f"layout.nnodes = {nnodes}: every trial spans the nodes; run one "
                           "tuner (--workers 1) on node 0 and a follower on each other node")
    if args.follow:
        if not 1 <= args.node_rank < nnodes:
            raise HarnessError(f"--node-rank {args.node_rank}: a follower's rank is 1 to "
                               f"{nnodes - 1}")
        if not args.storage:
            raise HarnessError("--follow needs --storage: the storage node 0's tuner uses")
    elif args.node_rank != 0:
        raise HarnessError(f"--node-rank {args.node_rank}: on nodes other than 0 add --follow")


def _load_study(args: argparse.Namespace, probe: Any):
    from training_harness.cli.tune_check import check_run_folder
    from training_harness.study.study_file import Study

    if args.helper:
        return Study.from_toml(args.study)
    if args.resume:
        run_dir = Path(args.out) if args.out else None
        if run_dir is None:
            name = Study.from_toml(args.study).name if args.study else _default(probe).name
            run_dir = Path("runs") / name
        check_run_folder(run_dir, given=bool(args.out))  # before exists() can fail on it
        path = run_dir / "study.toml"
        if not path.exists():
            raise HarnessError(f"--resume: {run_dir} holds no study (no study.toml); "
                               "start it without --resume")
        return Study.from_toml(path)
    return Study.from_toml(args.study) if args.study else _default(probe)


def _default(probe: Any):
    from training_harness.launch import rank_server
    from training_harness.study.defaults import default_study

    rank_server.warm_up()  # a default study's trials are forked here: see `check`
    cuda = probe.devices()["cuda"]
    return default_study("cuda", cuda) if cuda else default_study("cpu")


def _launcher_kind(spec: str | None, study: Any) -> str:
    """"local", "slurm" (the flag, else the study's cluster.launcher), or "function" (a
    user's package.module:function)."""
    if spec in (None, "local", "slurm"):
        return spec or (study.cluster.launcher if study.cluster else "local")
    return "function"


def _forks_trials(spec: str | None, study: Any) -> bool:
    """Whether this tuner forks its trials' ranks from its own rank server: the local
    launcher on one node (training_harness.launch.local.launch)."""
    local = _launcher_kind(spec, study) == "local" or spec == "training_harness.launch.local:launch"
    return local and study.layout.nnodes == 1


def _launcher(spec: str | None, study: Any, device_type: str):
    """The study's Launcher (training_harness.launch.launcher): LocalLauncher; the SlurmLauncher
    (`slurm`, or the study's cluster.launcher), checked against Slurm; or a user's
    `package.module:function` of training_harness.launch.local.launch's signature, wrapped in a
    FunctionLauncher (or a Launcher instance, taken as it is)."""
    import dataclasses
    import importlib

    from training_harness.core.cluster import ClusterSpec
    from training_harness.launch.launcher import Launcher, as_launcher
    from training_harness.launch.local import LocalLauncher, launch

    if spec in ("local", "slurm"):  # kept in the study: --resume runs where it started
        study.cluster = dataclasses.replace(study.cluster or ClusterSpec(), launcher=spec)
        study.validate("study")
    kind = _launcher_kind(spec, study)
    if kind == "local":
        return LocalLauncher()
    if kind == "slurm":
        from training_harness.launch.slurm import launcher_for

        return launcher_for(study.cluster, device_type, study.layout.world_sizes,
                            study.budget.trial_timeout_s, study.layout.nnodes)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise HarnessError(f"--launcher {spec!r}: write package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as e:
        raise HarnessError(f"--launcher {spec!r}: cannot import {module_name} ({e})") from None
    if not (isinstance(fn, Launcher) or callable(fn)):
        raise HarnessError(f"--launcher {spec!r}: {module_name} has no function {attr}")
    return LocalLauncher() if fn is launch else as_launcher(fn)
