"""After the search: the confirmation rounds, then the ablation, run by one worker.

Of the workers sharing a study, the one holding the study's claim (the storage's
user attribute "ablation_owner") runs them; `--resume` takes the claim over.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.tune.final.ablation import run_ablation
from harness.tune.final.confirmation import run_confirmation
from harness.tune.recovery.workers import Worker
from harness.tune.tuner_state import TunerState

OWNER = "ablation_owner"  # the storage's user attribute naming the worker that runs them


def run_final_phases(ctx: TunerState, take_over: bool, say: Callable[[str], None]) -> str:
    """Measure the contenders again, then ablate the best; how the ablation ended, in words."""
    budget = ctx.study.budget
    if not budget.ablation_repeats and not budget.confirm_repeats:
        return "off (budget.ablation_repeats = 0)"
    if not _claim(ctx, take_over):
        return "another worker runs it"
    if budget.confirm_repeats:
        say("the contenders for the best measured again, in rounds")
        say(f"confirmation: {run_confirmation(ctx)}")
    say("ablation of the best configuration")
    return run_ablation(ctx)


def _claim(ctx: TunerState, take_over: bool) -> bool:
    """Last writer wins, after a pause long enough for every claim to land."""
    study, me = ctx.optuna_study, ctx.me
    owner = Worker.parse(study.user_attrs.get(OWNER))
    if owner is not None and owner != me and owner.alive() and not take_over:
        return False
    study.set_user_attr(OWNER, me.tag)
    time.sleep(1.0)
    return study.user_attrs.get(OWNER) == me.tag
