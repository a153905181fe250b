"""One trial of a study, from plan to record: check, predict, launch or not.

    1. the plan is checked against this machine (strategies.reasons_against, in
       the tuner's torch-side helper: training_harness.launch.torch_helper); a refused plan is a
       `pruned` record with the reasons, never launched;
    2. the estimator predicts it (the same helper, once: the prepared plan is
       what the ranks read), corrected from the study's measured trials
       (training_harness.tune.model.correction); over the
       memory budget: a `pruned` record with the prediction, never launched;
    3. expected to end after the deadline: a `pruned` record, not started;
    4. otherwise launched in its own processes (training_harness.launch.local), with a hard
       timeout of min(its own, time left), and `should_stop` for early stopping.

Each trial's folder (runs/<study>/trials/<id>/) holds plan.toml, command.txt,
logs/ and result.json; a trial that was not launched has no logs/. One launched
as a job that may outlive its tuner (a Slurm job) also has launched.json (its tags
and prediction): the next tuner waits for that job (`rejoin_trial_job`) and gives
the trial the record it would have had.
"""

from __future__ import annotations

import json
import shlex
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.prepared import PreparedPlan
from training_harness.core.units import format_bytes, format_seconds
from training_harness.launch.launcher import Launcher
from training_harness.launch.local import LocalLauncher
from training_harness.launch.run import run_plan
from training_harness.launch.torch_helper import TorchHelper
from training_harness.records.result import TrialResult
from training_harness.records.run_store import RunStore, write_atomic
from training_harness.records.step_log import read_steps
from training_harness.records.tags import PRUNED_MEMORY, PRUNED_REFUSED, PRUNED_SLOW, PRUNED_TIME
from training_harness.study.machine_facts import MachineFacts
from training_harness.tune.budget import MARGIN, fits, launch_timeout
from training_harness.tune.model.correction import Correction
from training_harness.tune.optuna_outcome import memory_excess_bytes

if TYPE_CHECKING:
    from training_harness.tune.recovery.follower import Announcer

LAUNCHED = "launched.json"  # in a launched trial's folder: its tags and prediction


@dataclass
class TrialRunner:
    """What every trial of one study shares."""

    name: str
    store: RunStore
    budget_bytes: int
    facts: MachineFacts  # the device; its env goes into records made without a trial
    torch_helper: TorchHelper  # prepares each plan (torch runs there, never in the tuner)
    launcher: Launcher = field(default_factory=LocalLauncher)
    nodes: Announcer | None = None  # for trials spanning several nodes
    expandable_segments: bool = True  # the study's budget.expandable_segments


@dataclass
class EarlyStop:
    """The search's slow-trial rule (training_harness.tune.search.slow_trials), as the expected
    cost of a trial sees it: stopped after `min_steps` when slower than the best so far
    (`best_samples_per_s`) divided by `slower_than`."""

    best_samples_per_s: float
    slower_than: float
    min_steps: int

    def expected(self, correction: Correction, predicted: dict[str, Any], plan: Plan) -> bool:
        """Whether the corrected prediction says this trial will be stopped early."""
        step = correction.step_time(predicted, plan.to_dict())
        return bool(step and self.slower_than and
                    plan.batch_size / step * self.slower_than < self.best_samples_per_s)


def command_for(store: RunStore, trial_id: int | str) -> str:
    return f"harness bench {shlex.quote(str(store.trial_dir(trial_id) / 'plan.toml'))}"


def run_trial_job(
    run: TrialRunner,
    trial_id: int | str,
    plan: Plan,
    tags: dict[str, Any],
    correction: Correction,
    deadline: float,
    should_stop: Callable[[], str | None] | None = None,
    early_stop: EarlyStop | None = None,
) -> TrialResult:
    """Run (or decide not to run) one trial; returns its record, also in result.json.
    With `early_stop` (the search's slow-trial rule), a trial predicted to be stopped for
    slowness is expected to cost only the steps before that stop."""
    # each rank's allocator capped at the budget; expandable segments as the study says
    plan = plan.replace(name=f"{run.name}-{trial_id}",
                        memory_budget_bytes=int(run.budget_bytes or 0) or None,
                        expandable_segments=run.expandable_segments)
    command = command_for(run.store, trial_id)
    folder = run.store.write_trial_files(trial_id, plan.to_toml(), command)
    tags = dict(tags)
    predicted: dict[str, Any] = {}
    asked: list[str] = []  # "prepared" once the helper took the plan; "nodes" once announced
    not_started: list[TrialResult] = []  # the record of a trial the budgets kept back

    def before_launch(prep: PreparedPlan) -> TrialResult | dict[str, Any]:
        """The tuner's budgets, given the prepared plan: a record of a trial not started,
        or what its launch needs (its timeout, early stopping, the other nodes)."""
        asked.append("prepared")
        predicted.update(prep.predicted or {})
        peak = correction.peak_memory(predicted)
        n_steps = prep.plan.warmup_steps + prep.plan.steps
        planned = prep.plan.to_dict()
        expected = correction.trial_seconds(predicted, n_steps, run.facts.device_type, planned)
        if early_stop is not None and early_stop.expected(correction, predicted, prep.plan):
            expected = min(expected, correction.trial_seconds(
                predicted, prep.plan.warmup_steps + early_stop.min_steps,
                run.facts.device_type, planned))
        # The corrected step time, learnt from the trials measured before this one: its
        # error against the measured step is the study's prediction error after n trials.
        predicted.update(calibrated_peak_memory_bytes=peak, expected_trial_s=expected,
                         corrected_step_time_s=correction.step_time(predicted, planned),
                         corrected_from_trials=correction.n_time,
                         calibration=correction.as_dict())  # the record's key
        if peak is not None and peak > run.budget_bytes:
            tags["pruned"] = PRUNED_MEMORY
            return _held(not_started, run, trial_id, prep.plan, predicted, command, tags, (
                f"not launched: predicted peak memory {format_bytes(peak)} per device "
                f"(estimator {format_bytes(predicted.get('peak_memory_bytes'))}, corrected "
                f"by {correction.n_memory} measured trial(s)) is over the memory budget "
                f"{format_bytes(run.budget_bytes)}"))
        left = deadline - time.time()
        # Before any trial is measured the steps' time is the estimator's alone (on a busy
        # machine its measured peak can be 20x low): only the start-up may rule it out.
        judged = expected if correction.n_time else correction.start_seconds(
            run.facts.device_type, planned)
        if not fits(judged, left):
            tags["pruned"] = PRUNED_TIME
            return _held(not_started, run, trial_id, prep.plan, predicted, command, tags, (
                f"not started: expected to take {format_seconds(expected)} ({MARGIN}x that "
                f"must fit), and {format_seconds(max(left, 0))} of the budget is left"))
        timeout = launch_timeout(prep.plan.timeout_s, left)
        kwargs: dict[str, Any] = dict(study=run.name, trial_id=trial_id, timeout_s=timeout,
                                      progress_file=folder / "steps.log",
                                      should_stop=should_stop)
        if run.nodes is not None:  # the other nodes' followers join this trial
            asked.append("nodes")
            kwargs.update(run.nodes.launch_kwargs(trial_id, prep, command, timeout))
        if run.launcher.may_leave_jobs:  # its job may outlive us
            # What finishes its record, for a tuner that rejoins it (rejoin_trial_job).
            write_atomic(folder / LAUNCHED, json.dumps({"tags": tags, "predicted": predicted}))
        return kwargs

    try:
        result = run_plan(plan, folder, command, launcher=run.launcher,
                          helper=run.torch_helper, peaks=run.facts.peaks,
                          before_launch=before_launch)
    except HarnessError as e:
        if asked:  # not the helper's refusal
            raise
        tags["pruned"] = PRUNED_REFUSED
        return _not_run(run, trial_id, plan, None, command, tags,
                        f"not launched: this configuration cannot run here: {e}")
    finally:
        if "nodes" in asked:
            run.nodes.done(trial_id)
    if not_started:
        return result  # the budgets kept it back: its record is made
    return _finished(result, folder, tags, predicted, deadline, run.budget_bytes)


def left_a_job(run: TrialRunner, trial_id: int | str) -> bool:
    """Whether trial `trial_id` was launched as a job that may outlive its tuner (the
    launcher's `has_job`: training_harness.launch.slurm), so a new tuner can wait for it."""
    folder = run.store.trial_dir(trial_id)
    return (run.launcher.may_leave_jobs and (folder / LAUNCHED).is_file()
            and run.launcher.has_job(folder))


def rejoin_trial_job(run: TrialRunner, trial_id: int | str, deadline: float,
                     should_stop: Callable[[], str | None] | None = None
                     ) -> TrialResult | None:
    """The record of a trial a stopped tuner launched as a job: the job waited for
    (launcher.rejoin) and the record finished as `run_trial_job` would have; None when
    there is nothing to wait for (the job ended without a record)."""
    folder = run.store.trial_dir(trial_id)
    try:
        launched = json.loads((folder / LAUNCHED).read_text())
    except (OSError, ValueError):
        return None
    result = run.launcher.rejoin(folder, deadline=deadline, should_stop=should_stop)
    if result is None:
        return None
    return _finished(result, folder, launched["tags"], launched["predicted"], deadline,
                     run.budget_bytes)


def _finished(result: TrialResult, folder: Path, tags: dict[str, Any],
              predicted: dict[str, Any], deadline: float, budget_bytes: int) -> TrialResult:
    """The launcher's record with the tuner's prediction and tags, in result.json."""
    tags = dict(tags)
    result.predicted = {**(result.predicted or {}), **predicted}
    if result.status == "timeout" and time.time() >= deadline - 1.0:
        tags["deadline"] = True
        result.reason = f"stopped at the study's deadline; {result.reason or ''}".rstrip("; ")
    if result.status == "pruned":
        tags["pruned"] = PRUNED_SLOW
        result.metrics["slow_stop"] = _rate_at_stop(folder / "steps.log", result.plan)
    result.tags = {**result.tags, **tags}
    _keep_excess(result, budget_bytes)
    result.write(folder / "result.json")
    return result


def _rate_at_stop(steps_file: Path, plan: dict[str, Any]) -> dict[str, Any] | None:
    """What a trial stopped for slowness measured before it was stopped: its steps, and
    the median throughput the stop judged (training_harness.tune.search.slow_trials)."""
    times = [t for t in read_steps(steps_file) if t > 0]
    if not times:
        return None
    rate = Plan.from_dict(plan).batch_size / statistics.median(times)
    return {"steps": len(times), "samples_per_s": rate}


def _held(not_started: list[TrialResult], *args: Any) -> TrialResult:
    """`_not_run`'s record, kept in `not_started` too."""
    not_started.append(_not_run(*args))
    return not_started[-1]


def _not_run(run: TrialRunner, trial_id: int | str, plan: Plan, predicted: dict | None,
             command: str, tags: dict[str, Any], reason: str) -> TrialResult:
    result = TrialResult.not_measured(
        "pruned", reason, study=run.name, trial_id=trial_id, plan=plan.to_dict(),
        predicted=predicted, env=run.facts.env, command=command, tags=tags)
    _keep_excess(result, run.budget_bytes)
    result.write(run.store.trial_dir(trial_id) / "result.json")
    return result


def _keep_excess(result: TrialResult, budget_bytes: int) -> None:
    """A trial over the memory budget (or out of memory) keeps how far over it was
    (metrics.memory_excess_bytes; negative: the room it left)."""
    if result.status == "ok" or result.status == "oom" or (
            result.tags.get("pruned") == PRUNED_MEMORY):
        excess = memory_excess_bytes(result.to_dict(), budget_bytes)
        result.metrics["memory_excess_bytes"] = int(excess) if excess else None
