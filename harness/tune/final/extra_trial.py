"""One trial run outside the sampler's asking (the confirmation rounds' and the ablation's),
and the one rule for running such a trial again.

`ExtraTrials.run` makes the trial RUNNING in the storage with its configuration and this
worker as owner (ask() never hands it out), runs it, measures it again if the machine
was busy (training_harness.tune.search.busy_machine), records it, then tells Optuna: the same
order as a search trial, so recovery settles it as any other.

`attempt_id` is the retry rule: on --resume a trial already recorded to the end is not
run again; one that never finished (not started for lack of time, stopped at the
deadline, or its worker gone) runs again under a new id, `<id>-retry<k>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from training_harness.core.plan import Plan
from training_harness.records.predicates import finished
from training_harness.records.result import TrialResult
from training_harness.study.search_space import SearchSpace
from training_harness.tune.budget import Clock
from training_harness.tune.model.correction import Corrections
from training_harness.tune.recorder import Recorder
from training_harness.tune.search.busy_machine import measure_again_if_busy
from training_harness.tune.trial_job import TrialRunner, run_trial_job


def attempt_id(recorded: dict[str, dict[str, Any]], trial_id: str) -> str | None:
    """The id to run trial `trial_id` under: itself, `<id>-retry<k>` when its earlier
    attempts did not finish, or None when one of them finished (nothing to run)."""
    tries = [i for i in recorded if i == trial_id or i.startswith(f"{trial_id}-retry")]
    if any(finished(recorded[i]) for i in tries):
        return None
    return f"{trial_id}-retry{len(tries)}" if tries else trial_id


@dataclass
class ExtraTrials:
    """Runs the final phases' trials: one configuration at a time, outside the sampler."""

    space: SearchSpace
    run: TrialRunner
    recorder: Recorder
    corrections: Corrections
    clock: Clock
    on_event: Callable[[str, dict[str, Any]], None]

    def run_trial(self, trial_id: str, params: dict[str, Any], tags: dict[str, Any],
                  window_s: float | None = None) -> TrialResult:
        """Run one configuration as trial `trial_id` with `tags` (phase first); its
        record. `window_s`: its measured window lasts at least this long (a
        confirmation round's longer window)."""
        plan = self.space.plan(params)
        if window_s:
            plan = plan.replace(min_window_s=max(window_s, plan.min_window_s or 0.0))
        used = self.space.distributions(params)
        phase = tags["phase"]
        number = self.recorder.start_trial({k: params[k] for k in used}, used, {
            "phase": phase, "trial_id": trial_id, "plan": plan.to_dict()})
        with self.recorder.holding(number, trial_id, phase, plan.to_dict()):
            result = self.measure(trial_id, plan, {**tags, "optuna_number": number})
            self.recorder.record_then_tell(result, number)
        self.on_event("end", result.to_dict())
        return result

    def run_unlisted(self, trial_id: str, plan: Plan, tags: dict[str, Any]) -> TrialResult:
        """Run `plan` as trial `trial_id` with no Optuna trial behind it (a variant: the
        sampler's history stays the search's); its record, written."""
        result = self.measure(trial_id, plan, tags)
        result.write(self.run.store.trial_dir(trial_id) / "result.json")
        self.run.store.append(result)
        self.on_event("end", result.to_dict())
        return result

    def measure(self, trial_id: str, plan: Plan, tags: dict[str, Any]) -> TrialResult:
        """Run `plan` as trial `trial_id`, again if the machine was busy; its record,
        not yet written."""
        self.on_event("start", {"trial_id": trial_id, "plan": plan.to_dict(),
                                "phase": tags["phase"], "duplicate": False})

        def attempt() -> TrialResult:
            return run_trial_job(self.run, trial_id, plan, tags, self.corrections(),
                                 self.clock.deadline)

        return measure_again_if_busy(
            attempt(), attempt, self.clock.budget_s, self.clock.left(),
            say=lambda text: self.on_event("note", {"text": text}))
