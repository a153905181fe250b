"""`harness tune --check`: the run folder's last check, and what a run would do.

`check_run_folder` refuses a run folder that could not be made or written before
anything is created (it creates nothing itself: it looks at the nearest part of
the path that exists). `what_would_run` is what `--check` prints instead of running.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError

MAX_PATH = 3840  # bytes: Linux's PATH_MAX is 4096, and the run folder holds trials/<id>/...


def check_run_folder(run_dir: Path, given: bool) -> None:
    """A HarnessError unless `run_dir` exists as a folder this user may write in, or
    could be made: the nearest existing part of its path is such a folder."""
    shown = str(run_dir) if len(str(run_dir)) <= 200 else f"{str(run_dir)[:60]}..."
    what = f"--out {shown}" if given else f"run folder {shown}"
    fix = ("give --out a folder you can write to" if given
           else "run from a folder you can write to, or give --out DIR")
    if "\x00" in str(run_dir):
        raise HarnessError(f"{what}: a path cannot hold a NUL character; {fix}")
    path = run_dir.absolute()
    if len(os.fsencode(str(path))) > MAX_PATH:
        raise HarnessError(f"{what}: the path is too long (more than {MAX_PATH} bytes, with "
                           f"room for the files inside); {fix}")
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path.name)
        path = path.parent
    if too_long := [n for n in missing if len(os.fsencode(n)) > 255]:
        raise HarnessError(f"{what}: the name {too_long[0][:40]!r}... is too long for a "
                           f"folder; {fix}")
    if not os.path.isdir(path):
        kind = "is not a folder" if os.path.exists(path) else "is a broken link"
        if not missing:
            raise HarnessError(f"{what}: it exists and {kind}; {fix}")
        raise HarnessError(f"{what}: {path} {kind}, so the run folder cannot be made in it; "
                           f"{fix}")
    if not os.access(path, os.W_OK | os.X_OK):
        verb = "make the run folder in" if missing else "write in"
        raise HarnessError(f"{what}: cannot {verb} {path} (not writable); {fix}")


def _storage(args: argparse.Namespace, ready: Any) -> str:
    from training_harness.tune.storage import describe_storage

    text = describe_storage(args.storage, ready.run_dir)
    if args.storage and "://" in args.storage and not args.storage.startswith("redis://"):
        s = ready.study.storage
        text += (f" (heartbeat {s.heartbeat}, grace {s.grace}, retries {s.retries}, "
                 f"patience {s.patience}; not connected by --check)")
    return text


def what_would_run(args: argparse.Namespace, ready: Any) -> str:
    """What `harness tune` would run with these flags (ready: a checked CheckedStudy,
    training_harness.tune.checked_study)."""
    from training_harness.core.errors import one_line
    from training_harness.core.units import format_bytes
    from training_harness.study.study_file import memory_spec

    study, space = ready.study, ready.space
    budget = study.budget
    size = space.size()
    source = (ready.run_dir / "study.toml" if args.resume and not args.study
              else args.study or "the default study for this device")
    objectives = ", ".join(f"{o} ({d})" for o, d in zip(study.objectives, study.directions,
                                                       strict=True))
    device = f"{ready.device_type} ({ready.facts.device_name})"
    if len(ready.groups) > 1:
        device += f", {len(ready.groups)} workers"
    if study.layout.nnodes > 1:
        device += f", trials span {study.layout.nnodes} nodes"
    layouts = ", ".join(f"{lay.data}x{lay.pipeline}x{lay.tensor}" for lay in space.layouts)
    trials = (f"at most {budget.n_trials} search trials" if budget.n_trials
              else "search trials as time allows")
    space_text = (f"{size} configurations" if size is not None
                  else "unbounded (some settings are ranges)")
    launcher = ready.launcher
    state = ("holds the study; --resume continues it" if args.resume or args.helper
             else "a follower's logs" if args.follow
             else (f"already holds study '{study.name}'; a run would need --resume to "
                   "continue it, or --out DIR to start a new one")
             if (ready.run_dir / "study.toml").exists()
             else "exists; the study's files go in it" if ready.run_dir.exists()
             else "new; not created yet")
    kind, number = memory_spec(budget.memory)
    memory = f"{format_bytes(ready.budget_bytes)} per device" + (
        f" ({number:g} of its memory)" if kind == "fraction" else "")
    rows = [
        ("study", f"{study.name}, from {source}"),
        ("objective", objectives),
        ("device", device),
        ("workload", f"{study.workload}; layouts (data x pipeline x tensor): {layouts}; "
                     f"micro-batches {study.micro_sizes}, global batch {study.global_batch_size}"),
        ("strategies", ", ".join(study.strategies) or "none"),
        ("search space", f"{space_text}, sampler {study.sampler}"),
        *[("left out", line) for line in space.left_out],
        ("budget", f"{_duration(budget.time)} wall clock, {trials}, "
                   f"{_duration(budget.trial_timeout)} per trial"),
        ("memory", memory),
        ("estimator", _estimator(ready.facts)),
        ("first trials", ", ".join(phase for phase, _ in ready.references)),
        ("start", describe_start(study, size, len(ready.references))),
        ("run folder", f"{ready.run_dir} ({state})"),
        ("storage", _storage(args, ready)),
        ("launcher", launcher.name),
    ]
    lines = [f"harness tune --check: study '{study.name}' is ready to run (nothing was "
             "created or launched)"]
    lines += [f"  {key:<13} {value}" for key, value in rows]
    return "\n".join(one_line(line) for line in lines)


def _estimator(facts: Any) -> str:
    """What the search's first guesses rest on: a measured profile, or the datasheet."""
    if facts.profile_measured:
        return f"this device's profile (harness calibrate, {facts.profile_measured})"
    device = "" if facts.device_type == "cpu" else " --device cuda"
    return ("no profile of this device: a step costed at the datasheet's peak and an "
            "assumed MFU, the same at every micro-batch; `harness calibrate"
            f"{device}` measures one (about a minute) for the search's first guesses")


def _duration(value: str | float) -> str:
    """A budget's duration as the user wrote it: "3m", or seconds."""
    return value.strip() if isinstance(value, str) else f"{value:g}s"


def describe_start(study: Any, size: int | None, n_references: int) -> str:
    """How a study of `size` configurations starts, in a line."""
    from training_harness.tune.model.estimator_model import sample_size
    from training_harness.tune.search.first_guesses import tier_limit
    from training_harness.tune.search.sampling import startup_trials

    refs = f"{n_references} reference(s)"
    if study.sampler == "grid":
        return f"{refs}, then every configuration in a seeded order (grid)"
    if study.sampler == "random":
        return f"{refs}, then random proposals"
    if study.sampler == "nsga2" or (study.sampler == "auto" and len(study.objectives) > 1):
        return f"{refs}, then NSGA-II (several objectives)"
    n = sample_size(study.budget.time_s)
    among = (f"all {size:,} configurations" if size is not None and size <= n
             else f"a sample of {n} of {size:,} configurations, 8 more each trial"
             if size is not None else f"a sample of {n} configurations (some settings "
             "are ranges), 8 more each trial")
    if study.objectives == ["throughput"]:
        return (f"{refs}, then the GuidedSampler over {among}: the estimator's fastest "
                "first, then the highest expected improvement of the estimator corrected "
                "by the measured trials, with its uncertainty (one trial in five TPE's); a "
                "trial over the memory budget runs again one micro-batch smaller (or "
                "checkpointed)")
    return (f"{refs}, then up to {tier_limit(size)} of the estimator's fastest predictions "
            f"among {among}, then TPE ({startup_trials(size)} random start-up trials)")
