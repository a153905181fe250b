"""The launcher seam: what the tuner asks of whatever runs its trials.

    launcher.launch(prepared, "runs/x/trials/3", command, trial_id=3, timeout_s=900)
    launcher.max_jobs                   # trials it may have in flight at once
    launcher.has_job(folder)            # a stopped tuner's job may still run there
    launcher.rejoin(folder, deadline=t) # that job waited for again (or None)
    launcher.cancel_job(folder)         # that job stopped: its trial was failed meanwhile
    launcher.check_shared(run_dir)      # do the machines that run trials see the folder

Three implementations: training_harness.launch.local.LocalLauncher (this machine's processes),
training_harness.launch.slurm.SlurmLauncher (one Slurm job a trial) and FunctionLauncher below,
which wraps a user's `--launcher package.module:function`. Only `launch` must be
written; the rest have the defaults of a launcher whose trials run here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training_harness.core.prepared import PreparedPlan
    from training_harness.records.result import TrialResult

StopCheck = Callable[[], str | None]  # a launch's `should_stop`: a reason to stop, or None


class Launcher(ABC):
    """Runs one trial from its prepared plan and returns its record (in the style of
    Optuna's BaseSampler: one method to write, the others with defaults).

    `launch(prepared, out_dir, command, **kwargs) -> TrialResult`: the signature of
    training_harness.launch.local.launch (keyword arguments study, trial_id, nnodes, node_rank,
    rdzv_endpoint, timeout_s, progress_file, should_stop). It returns the trial's
    record, also written to out_dir/result.json, whatever the trial did (a failed,
    timed-out or stopped trial is a record, not an exception); it polls `should_stop`
    while the trial runs and stops the trial when it gives a reason (a `pruned`
    record). KeyboardInterrupt (Ctrl-C, or the tuner stopping, raised from
    `should_stop`) goes through, after the launch has stopped what it started.

    `max_jobs` (default 1): how many trials the tuner may keep in flight at once.
    Above 1 the tuner calls `launch` from that many threads at the same time, so
    `launch` (and `rejoin`) must then be thread safe; at 1 every call comes from the
    tuner's own thread, one at a time.

    `may_leave_jobs` (default False): whether a trial launched may leave a job that
    outlives the tuner (a Slurm job). Only then does the tuner write launched.json
    before `launch`, and a restarted tuner look for such jobs with `has_job`.

    `has_job(folder)` (default False): whether a trial's folder says that a job was
    started for it that may outlive the tuner; a restarted tuner calls `rejoin` for
    such trials.

    `rejoin(folder, deadline=, should_stop=)` (default None): the record of the trial
    whose job a stopped tuner left in `folder`, waited for as `launch` would have
    (stopped at `deadline`, epoch seconds); None when there is nothing to wait for
    (the trial must run again).

    `cancel_job(folder)` (default None): stop the job a stopped tuner left in
    `folder` if it still runs, and wait until it has gone: its trial was failed
    meanwhile (another worker took the tuner's silence for death and queued it again),
    so no one will wait for it. What was done, in words; None when nothing ran.

    `check_shared(run_dir)` (default None): for trials that run on other machines,
    whether they see the run folder; None when they do (or the trials run here), a
    note to print when it could not be told, HarnessError when they do not.
    """

    max_jobs: int = 1
    may_leave_jobs: bool = False

    @abstractmethod
    def launch(self, prepared: PreparedPlan, out_dir: str | Path, command: str,
               **kwargs: Any) -> TrialResult:
        """Run the trial; its record (see the class's doc)."""

    def has_job(self, folder: str | Path) -> bool:
        return False

    def rejoin(self, folder: str | Path, deadline: float | None = None,
               should_stop: StopCheck | None = None) -> TrialResult | None:
        return None

    def cancel_job(self, folder: str | Path) -> str | None:
        return None

    def check_shared(self, run_dir: str | Path) -> str | None:
        return None

    @property
    def name(self) -> str:
        """What `harness tune --check` shows: module:function."""
        return f"{type(self).__module__}:{type(self).__qualname__}"


class FunctionLauncher(Launcher):
    """A user's launch function (`--launcher package.module:function`, of
    training_harness.launch.local.launch's signature) as a Launcher.

    A function that carries attributes `max_jobs`, `has_job`, `rejoin`, `cancel_job`
    or `check_shared` (as the README has long documented for `max_jobs`) has them
    honoured: they are read once, here, when the function is wrapped; setting them
    on the function later changes nothing. Without them, the defaults of Launcher
    (a `has_job` attribute makes `may_leave_jobs` True)."""

    def __init__(self, fn: Callable[..., TrialResult]):
        self.fn = fn
        attrs = getattr(fn, "__dict__", None) or {}  # once, at wrap time
        self.max_jobs = max(1, int(attrs.get("max_jobs", 1) or 1))
        self.may_leave_jobs = attrs.get("has_job") is not None
        for hook in ("has_job", "rejoin", "cancel_job", "check_shared"):
            if attrs.get(hook) is not None:  # in place of Launcher's default
                setattr(self, hook, attrs[hook])
        module = getattr(fn, "__module__", None) or "?"
        qualname = getattr(fn, "__qualname__", None) or "?"
        self._name = f"{module}:{qualname}"

    def launch(self, prepared: PreparedPlan, out_dir: str | Path, command: str,
               **kwargs: Any) -> TrialResult:
        return self.fn(prepared, out_dir, command, **kwargs)

    @property
    def name(self) -> str:
        return self._name


def as_launcher(obj: Launcher | Callable[..., TrialResult]) -> Launcher:
    """A Launcher as it is; a plain function of launch's signature wrapped."""
    return obj if isinstance(obj, Launcher) else FunctionLauncher(obj)
