"""One trial run outside the sampler's asking (the confirmation rounds' and the ablation's),
and the one rule for running such a trial again.

`run_extra` makes the trial RUNNING in the storage with its configuration and this
worker as owner (ask() never hands it out), runs it, measures it again if the machine
was busy (harness.tune.search.busy_machine), records it, then tells Optuna: the same
order as a search trial, so recovery settles it as any other.

`attempt_id` is the retry rule: on --resume a trial already recorded to the end is not
run again; one that never finished (not started for lack of time, stopped at the
deadline, or its worker gone) runs again under a new id, `<id>-retry<k>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.records.predicates import finished
from harness.records.result import TrialResult
from harness.tune.search.busy_machine import measure_again_if_busy
from harness.tune.trial_job import run_trial_job

if TYPE_CHECKING:
    from harness.tune.tuner_state import TunerState


def attempt_id(recorded: dict[str, dict[str, Any]], trial_id: str) -> str | None:
    """The id to run trial `trial_id` under: itself, `<id>-retry<k>` when its earlier
    attempts did not finish, or None when one of them finished (nothing to run)."""
    tries = [i for i in recorded if i == trial_id or i.startswith(f"{trial_id}-retry")]
    if any(finished(recorded[i]) for i in tries):
        return None
    return f"{trial_id}-retry{len(tries)}" if tries else trial_id


def run_extra(ctx: TunerState, trial_id: str, params: dict[str, Any],
              tags: dict[str, Any], window_s: float | None = None) -> TrialResult:
    """Run one configuration as trial `trial_id` with `tags` (phase first); its record.
    `window_s`: its measured window lasts at least this long (a confirmation round's
    longer window)."""
    plan = ctx.space.plan(params)
    if window_s:
        plan = plan.replace(min_window_s=max(window_s, plan.min_window_s or 0.0))
    used = ctx.space.distributions(params)
    phase = tags["phase"]
    number = ctx.start_trial({k: params[k] for k in used}, used, {
        "phase": phase, "trial_id": trial_id, "plan": plan.to_dict()})
    with ctx.holding(number, trial_id, phase, plan.to_dict()):
        ctx.on_event("start", {"trial_id": trial_id, "plan": plan.to_dict(),
                                 "phase": phase, "duplicate": False})

        def attempt() -> TrialResult:
            return run_trial_job(ctx.run, trial_id, plan, {**tags, "optuna_number": number},
                                 ctx.correction(), ctx.clock.deadline)

        result = measure_again_if_busy(
            attempt(), attempt, ctx.clock.budget_s, ctx.clock.left(),
            say=lambda text: ctx.on_event("note", {"text": text}))
        ctx.record_then_tell(result, number)
    ctx.on_event("end", result.to_dict())
    return result
