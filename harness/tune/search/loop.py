"""The search: ask Optuna for a configuration, run it as a trial, record it, tell Optuna.

`Tuner.search` asks, runs and tells until a reason to stop (`_why_stop`). What runs next
is the sampler's decision alone (training_harness.tune.search.guided_sampler), with no queue beside
it. The record is written before Optuna is told (Recorder.record_then_tell), so a tuner
stopped between the two loses nothing; before each trial, `settle`
(training_harness.tune.recovery.resume.settle) fails and queues again the trials of dead workers.
Optuna is driven through ask/tell so that the harness decides what is launched, when a
trial is stopped, and which state each trial gets.

Trials that run elsewhere (a launcher with `max_jobs`: Slurm jobs) are kept in flight up
to that many at once, each in its own thread; the constant liar keeps Optuna from
proposing a pending configuration again, and one proposed while another trial runs it
waits for that record instead of running twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

from training_harness.core.plan import Plan
from training_harness.launch.jobs_in_flight import InFlight, max_jobs
from training_harness.records.result import TrialResult
from training_harness.records.tags import PRUNED_TIME, tags_of
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock
from training_harness.tune.model.correction import Corrections
from training_harness.tune.model.estimator_model import resolved_key
from training_harness.tune.recorder import Measured, Recorder
from training_harness.tune.search.busy_machine import measure_again_if_busy
from training_harness.tune.search.guided_sampler import GuidedSampler
from training_harness.tune.study_trials import RETRY_OF, StudyTrials
from training_harness.tune.trial_job import EarlyStop, TrialRunner, command_for, run_trial_job

if TYPE_CHECKING:  # given by the session: the final phases' reserve, which the search keeps
    from training_harness.tune.final.time_reserve import FinalTime

DUPLICATE_LIMIT = 25  # repeats in a row, for a sampler that cannot say it converged (TPE)
TIME_SKIPS = 5  # proposals in a row skipped for lack of time: the search is over


@dataclass
class Tuner:
    study: Study
    space: SearchSpace
    optuna_study: optuna.Study
    run: TrialRunner
    clock: Clock
    recorder: Recorder  # holds, records, then tells each trial
    trials: StudyTrials  # n_trials done, retries owed a run, the best so far
    measured: Measured  # configurations measured: a repeat proposal reuses the record
    corrections: Corrections  # the estimator corrected by the records so far
    final_time: FinalTime  # what the final phases need: the search leaves it to them
    settle: Callable[[], list[str]]  # training_harness.tune.recovery.resume.settle
    on_event: Callable[[str, dict[str, Any]], None]

    def __post_init__(self) -> None:
        self.size = self.space.size()
        self._pool = InFlight(1)
        self._running: dict[str, threading.Event] = {}  # configurations in flight: set at end
        self._repeats = 0  # proposals in a row of configurations measured before
        self._time_skips = 0  # proposals in a row that did not fit the time left
        self._last: TrialResult | None = None

    def search(self, first: Sequence[Callable[..., TrialResult]] = ()) -> str:
        """Ask, run, tell until a reason to stop; return that reason in words. Each of
        `first` (a stopped tuner's jobs, still running) is called with the `should_stop`
        its launcher must poll, before anything new is asked for."""
        self._pool = pool = InFlight(max_jobs(self.run.launcher))
        with pool:
            for wait in first:
                self._ended(pool.room())
                pool.start(lambda wait=wait: (wait(pool.guard(None)), False))
            while True:
                why = self._why_stop()
                if why is not None and not self._settled():
                    pool.drain()  # recorded; what ends now does not change why
                    return why
                done = pool.room()
                if done:  # something ended: the reasons to stop first
                    self._ended(done)
                    continue
                if why is not None or self._settled():  # a dead worker's trial: owed a run
                    continue
                trial = self.optuna_study.ask()  # the sampler decides (GuidedSampler)
                pool.start(lambda trial=trial: self._search_trial(trial))
                self._ended(pool.ended())

    def _settled(self) -> bool:
        """Settle what dead workers left (their trials failed and queued again); whether
        anything was (then the reasons to stop are weighed again: n_trials owes a retry)."""
        notes = self.settle()
        for note in notes:
            self.on_event("note", {"text": note})
        return bool(notes)

    def _ended(self, outcomes: list[tuple[TrialResult, bool]]) -> None:
        for result, repeat in outcomes:
            self._repeats = self._repeats + 1 if repeat else 0
            # A configuration expected not to fit the time left is skipped (its record
            # says so); the search goes on with ones that may fit, unless none did lately.
            timed = (result.tags or {}).get("pruned") == PRUNED_TIME
            self._time_skips = self._time_skips + 1 if timed else 0
            self._last = result

    def _why_stop(self) -> str | None:
        if self._time_skips >= TIME_SKIPS:
            last = self._last.reason if self._last else ""
            return (f"time: the last {self._time_skips} configurations proposed were each "
                    f"expected not to fit the time left ({last})")
        # One rule for every worker: helpers read the same records and the main worker's clock.
        if self.clock.left() - self.final_time.reserve_s() <= 0:
            return "time: the rest of the budget is for the final measurements"
        n = self.study.budget.n_trials
        if n and self.trials.n_reference_trials() >= n and not self.trials.retries_waiting():
            return f"n_trials: {n} search trials done"
        if self.size is not None and len(self.measured.by_key) >= self.size:
            return f"search space exhausted: all {self.size} configurations measured"
        sampler = self.optuna_study.sampler
        if isinstance(sampler, GuidedSampler) and sampler.converged:
            return sampler.converged
        if self._repeats >= DUPLICATE_LIMIT:
            return (f"converged: the sampler proposed {self._repeats} configurations in a "
                    "row that were already measured")
        return None

    def _search_trial(self, trial: optuna.Trial) -> tuple[TrialResult, bool]:
        phase = trial.user_attrs.get("phase", "search")
        with self.recorder.holding(trial.number, phase=phase) as held:  # mine to record from now
            # first: the worker tag claims the trial (resume.py)
            trial.set_user_attr("worker", self.recorder.me.tag)
            trial.set_user_attr("phase", phase)
            trial.set_user_attr("trial_id", trial.number)
            plan = self.space.suggest(trial)
            held.plan = plan.to_dict()
            tags = {"phase": phase, "optuna_number": trial.number}
            retry_of = trial.user_attrs.get(RETRY_OF)  # a dead worker's trial, run again
            if retry_of is not None:
                tags[RETRY_OF] = retry_of
            key = resolved_key(self.run.facts, plan)
            original, claim = self._measured_or_claim(key) if phase == "search" else (None, None)
            try:
                return self._measure(trial, phase, plan, tags, original)
            finally:
                if claim is not None:  # those waiting for this configuration find its record
                    self._running.pop(key, None)
                    claim.set()

    def _measured_or_claim(self, key: str) -> tuple[dict[str, Any] | None, Any]:
        """(the record of configuration `key` measured before, None), or (None, this
        trial's claim on it: an Event set when it ends). A configuration in flight in
        another trial is waited for: its record, not a second job (unless it ended
        without one that counts: then this trial runs it)."""
        while True:
            found = self.measured.by_key.get(key)
            if found is not None:
                return found, None
            mine = threading.Event()
            other = self._running.setdefault(key, mine)
            if other is mine:
                return None, mine
            other.wait()
            if self._pool.stopping.is_set():
                raise KeyboardInterrupt("the tuner is stopping")

    def _measure(self, trial: optuna.Trial, phase: str, plan: Plan, tags: dict[str, Any],
                 original: dict[str, Any] | None) -> tuple[TrialResult, bool]:
        run, clock, on_event = self.run, self.clock, self.on_event
        on_event("start", {"trial_id": trial.number, "plan": plan.to_dict(),
                               "phase": phase, "duplicate": original is not None})
        trial.set_user_attr("plan", plan.to_dict())
        if original is not None:
            result = _repeat_record(original, trial.number, tags)
            result.command = command_for(run.store, trial.number)
            run.store.write_trial_files(
                trial.number, Plan.from_dict(result.plan).to_toml(), result.command)
        else:
            attempts: list[int] = []

            def attempt() -> TrialResult:
                # Optuna keeps the first attempt's step values: the second reports none.
                stop, early = (self._slow_rules(trial, plan, report=not attempts)
                               if phase == "search" else (None, None))
                attempts.append(1)
                return run_trial_job(run, trial.number, plan, tags, self.corrections(),
                                     clock.deadline, should_stop=self._pool.guard(stop),
                                     early_stop=early)

            result = measure_again_if_busy(
                attempt(), attempt, clock.budget_s, clock.left(),
                say=lambda text: on_event("note", {"text": text}))
        if not self.recorder.record_then_tell(result, trial.number, trial):
            on_event("note", {"text": f"trial {trial.number}: another worker failed it "
                                      "while it ran (no heartbeat reached the storage); "
                                      "its record stands here, the storage keeps the retry"})
        on_event("end", result.to_dict())
        return result, original is not None

    def _slow_rules(self, trial: optuna.Trial, plan: Plan, report: bool
                    ) -> tuple[Any, EarlyStop | None]:
        """The slow-trial rule: the stop that watches the running trial, and the rule as
        the trial's expected cost sees it (single objective, once there is a best)."""
        from training_harness.core.interference import BusyWatch
        from training_harness.tune.search.slow_trials import SlowTrialStop

        pruning, single = self.study.pruning, len(self.study.objectives) == 1
        best = self.trials.best_throughput()
        stop = SlowTrialStop(
            self.run.store.trial_dir(trial.number) / "steps.log", plan.batch_size, best,
            pruning.slower_than if single else 0.0, pruning.min_steps,
            report=trial.report if single and report else None,
            on_step=lambda n: self.on_event("step", {"trial_id": trial.number, "steps": n}),
            busy=BusyWatch())
        early = EarlyStop(best[0], pruning.slower_than, pruning.min_steps) if best else None
        return stop, (early if single else None)


def _repeat_record(original: dict[str, Any], number: int, tags: dict) -> TrialResult:
    """A configuration measured before is not run again: its record, under this trial."""
    copy = TrialResult.from_dict(json.loads(json.dumps(original)))
    copy.trial_id = number
    copy.duration_s = 0.0
    kept = {k: v for k, v in tags_of(original).items() if k == "pruned"}
    copy.tags = {**kept, **tags, "duplicate_of": original.get("trial_id")}
    return copy
