"""The tuner's loop: ask Optuna for a configuration, run it as a trial, tell the outcome.

    search     until the search share of the budget is spent, n_trials are done,
               or every configuration of a finite space has been measured: ask,
               run (harness.tune.trial_job: refused / over memory / out of time are
               records that were never launched), append the record, tell Optuna
    ablation   leave-one-out trials of the best (harness.tune.ablation), by the one
               worker that holds the study's ablation claim

Optuna is driven through ask/tell so that the harness decides what is launched,
when a trial is stopped, and which state each trial gets (harness.tune.sampling).
A record is appended to trials.jsonl before Optuna is told, so a tuner killed
between the two loses nothing: `recover` (on --resume) tells Optuna what the
record says, and marks trials whose tuner died mid-trial as failed. Before each
trial, `settle` does the same for workers that died meanwhile (on an RDB
storage, those that stopped sending heartbeats), and queues their trials again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from harness.core.plan import Plan
from harness.records.result import TrialResult
from harness.study.search_space import SearchSpace, config_key
from harness.study.study_file import Study
from harness.tune.budget import Clock
from harness.tune.calibration import Calibration
from harness.tune.sampling import PRUNED_SLOW, PRUNED_TIME, outcome, tell
from harness.tune.storage import Heartbeat
from harness.tune.trial_job import StudyRun, command_for, run_trial_job
from harness.tune.workers import Worker

DUPLICATE_LIMIT = 25  # proposals in a row of configurations already measured: converged
NEIGHBOUR_LIMIT = 20_000  # spaces up to this size are listed to find unmeasured neighbours
REFERENCE_PHASES = ("baseline", "known-good", "search")


@dataclass
class Tuner:
    study: Study
    space: SearchSpace
    optuna_study: optuna.Study
    run: StudyRun
    clock: Clock
    me: Worker = field(default_factory=Worker.this)
    on_event: Callable[[str, dict[str, Any]], None] = lambda kind, data: None
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # config key -> record
    _all: list[tuple[str, dict[str, Any]]] | None = None  # a finite space's configurations

    def __post_init__(self) -> None:
        self.size = self.space.size()
        for r in self.run.store.records():
            self.remember(r)

    # --- search ------------------------------------------------------------------
    def search(self) -> str:
        """Run search trials until a reason to stop; return that reason in words."""
        streak = 0
        while True:
            if self.clock.search_left() <= 0:
                return "time: the search share of the budget is spent"
            n = self.study.budget.n_trials
            if n and self.n_reference_trials() >= n and not self._retries_waiting():
                return f"n_trials: {n} search trials done"
            if self.size is not None and len(self.measured) >= self.size:
                return f"search space exhausted: all {self.size} configurations measured"
            if streak >= DUPLICATE_LIMIT:
                return (f"converged: the sampler proposed {streak} configurations in a row "
                        "that were already measured")
            for note in self.settle():
                self.on_event("note", {"text": note})
            trial = self.optuna_study.ask()
            result, duplicate = self._search_trial(trial)
            streak = streak + 1 if duplicate else 0
            if duplicate:
                self._enqueue_neighbour()
            if (result.tags or {}).get("pruned") == PRUNED_TIME:
                return f"time: {result.reason}"

    def _search_trial(self, trial: optuna.Trial) -> tuple[TrialResult, bool]:
        trial.set_user_attr("worker", self.me.tag)  # first: it claims the trial (resume.py)
        phase = trial.user_attrs.get("phase", "search")
        trial.set_user_attr("phase", phase)
        trial.set_user_attr("trial_id", trial.number)
        plan = self.space.suggest(trial)
        tags = {"phase": phase, "optuna_number": trial.number}
        retry_of = self._retry_of(trial)
        if retry_of is not None:
            tags["retry_of"] = retry_of
        key = _resolved_key(plan)
        original = self.measured.get(key) if phase == "search" else None
        self.on_event("start", {"trial_id": trial.number, "plan": plan.to_dict(),
                                "phase": phase, "duplicate": original is not None})
        trial.set_user_attr("plan", plan.to_dict())
        if original is not None:
            result = _repeat_record(original, trial.number, tags)
            result.command = command_for(self.run.store, trial.number)
            folder = self.run.store.write_trial_files(
                trial.number, Plan.from_dict(result.plan).to_toml(), result.command)
            result.write(folder / "result.json")
        else:
            stop = self._slow_stop(trial, plan) if phase == "search" else None
            with Heartbeat(self.optuna_study, trial._trial_id):  # RDB storages: I am alive
                result = run_trial_job(self.run, trial.number, plan, tags, self.calibration(),
                                       self.clock.deadline, should_stop=stop)
        self._finish(trial, result)
        return result, original is not None

    def _slow_stop(self, trial: optuna.Trial, plan):
        from harness.tune.pruning import SlowTrialStop

        single = len(self.study.objectives) == 1
        folder = self.run.store.trial_dir(trial.number)
        return SlowTrialStop(
            folder / "steps.log", plan.batch_size, self.best_throughput(),
            self.study.pruning.slower_than if single else 0.0, self.study.pruning.min_steps,
            report=trial.report if single else None,
            on_step=lambda n: self.on_event("step", {"trial_id": trial.number, "steps": n}),
        )

    def _retry_of(self, trial: optuna.Trial) -> Any:
        """The trial number this one runs again (a dead worker's), if it is a retry."""
        attrs = self.optuna_study._storage.get_trial_system_attrs(trial._trial_id)
        return attrs.get("failed_trial")

    def _finish(self, trial: optuna.Trial, result: TrialResult) -> None:
        self.run.store.append(result)  # first the record, then Optuna (see recover)
        record = result.to_dict()
        trial.set_user_attr("status", result.status)
        trial.set_user_attr("plan", result.plan)
        try:
            tell(self.optuna_study, trial, outcome(record, self.study.objectives,
                                                   self.run.budget_bytes))
        except optuna.exceptions.UpdateFinishedTrialError:  # failed by another worker
            self.on_event("note", {"text": f"trial {trial.number}: another worker failed it "
                                           "while it ran (no heartbeat reached the storage); "
                                           "its record stands here, the storage keeps the "
                                           "retry"})
        self.remember(record)
        self.on_event("end", record)

    def remember(self, record: dict[str, Any]) -> None:
        """Keep a measured configuration's record, so a repeat proposal reuses it. A
        trial stopped early for slowness is not kept: proposed again, it runs again
        (on a shared machine one unlucky moment should not rule a configuration out)."""
        tags = record.get("tags") or {}
        if tags.get("phase") not in REFERENCE_PHASES or tags.get("pruned") == PRUNED_SLOW:
            return
        if outcome(record, self.study.objectives, self.run.budget_bytes).state == TrialState.FAIL:
            return
        self.measured.setdefault(config_key(record["plan"]), record)

    def _enqueue_neighbour(self) -> None:
        """The sampler proposed a configuration measured before (TPE does, as it
        converges): queue the unmeasured configuration nearest the best instead
        (fewest parameters changed), so the budget goes to something new."""
        best = self.best_trial()
        if best is None or self.size is None or self.size > NEIGHBOUR_LIMIT:
            return
        if self._all is None:
            self._all = [(_resolved_key(self.space.plan(p)), p) for p in self.space.enumerate()]
        waiting = self.optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting:
            return  # one is queued already
        fresh = [(k, p) for k, p in self._all if k not in self.measured]
        if not fresh:
            return
        def distance(params: dict[str, Any]) -> int:
            keys = params.keys() | best.params.keys()
            return sum(params.get(k) != best.params.get(k) for k in keys)
        _, params = min(fresh, key=lambda kp: (distance(kp[1]), kp[0]))
        self.optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})

    # --- what the study knows so far ----------------------------------------------
    def calibration(self) -> Calibration:
        return Calibration.from_records(self.run.store.records())

    def reference_trials(self) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self.optuna_study.get_trials(deepcopy=False)
                if t.user_attrs.get("phase", "search") in REFERENCE_PHASES]

    def _retries_waiting(self) -> bool:
        """A dead worker's trial queued again is owed a run before n_trials stops us."""
        waiting = self.optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        return any("failed_trial" in t.system_attrs for t in waiting)

    def n_reference_trials(self) -> int:
        """Trials towards budget.n_trials: a dead worker's trial counts, its retry not."""
        return sum(t.state != TrialState.WAITING and "failed_trial" not in t.system_attrs
                   for t in self.reference_trials())

    def best_trial(self) -> optuna.trial.FrozenTrial | None:
        """The feasible trial with the highest throughput (on a Pareto front too)."""
        feasible = [t for t in self.reference_trials() if t.state == TrialState.COMPLETE
                    and all(v <= 0 for v in t.constraints.values()) and t.values]
        i = self.study.objectives.index("throughput") if "throughput" in \
            self.study.objectives else 0
        sign = 1 if self.study.directions[i] == "maximize" else -1
        return max(feasible, key=lambda t: sign * t.values[i], default=None)

    def best_throughput(self) -> tuple[float, str] | None:
        best = self.best_trial()
        if best is None or "throughput" not in self.study.objectives:
            return None
        i = self.study.objectives.index("throughput")
        return best.values[i], str(best.user_attrs.get("trial_id", best.number))

    # --- ablation -------------------------------------------------------------------
    def ablate(self) -> str:
        """Leave-one-out trials of the best (harness.tune.ablation); returns how it ended."""
        from harness.tune.ablation import run_ablation

        return run_ablation(self)

    # --- resume ---------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Settle the trials a stopped tuner left RUNNING (harness.tune.resume)."""
        from harness.tune.resume import recover

        return recover(self)

    def settle(self) -> list[str]:
        """Fail and retry the trials of workers that died meanwhile (harness.tune.resume)."""
        from harness.tune.resume import settle

        return settle(self)


def _resolved_key(plan) -> str:
    from strategies import resolved

    return config_key(resolved(plan))


def _repeat_record(original: dict[str, Any], number: int, tags: dict) -> TrialResult:
    """A configuration measured before is not run again: its record, under this trial."""
    copy = TrialResult.from_dict(json.loads(json.dumps(original)))
    copy.trial_id = number
    copy.duration_s = 0.0
    kept = {k: v for k, v in (original.get("tags") or {}).items() if k == "pruned"}
    copy.tags = {**kept, **tags, "duplicate_of": original.get("trial_id")}
    return copy
