"""After the search: the confirmation rounds, then the ablation, run by one worker.

Of the workers sharing a study, the one holding the study's claim (the storage's
user attribute "ablation_owner") runs them; `--resume` takes the claim over.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harness.tune.budget import MARGIN
from harness.tune.final.ablation import run_ablation
from harness.tune.final.confirmation import run_confirmation
from harness.tune.final.time_reserve import ablation_round_trials, round_trials, trial_seconds
from harness.tune.recovery.workers import Worker
from harness.tune.tuner_state import TunerState

MAX_ROUNDS = 10  # confirmation rounds, however much time is left
OWNER = "ablation_owner"  # the storage's user attribute naming the worker that runs them
CLAIM_PAUSE_S = 1.0  # between writing the claim and reading it back


def run_final_phases(ctx: TunerState, take_over: bool, say: Callable[[str], None],
                     search_done: bool = False) -> str:
    """Measure the contenders again, then ablate the best; how the ablation ended, in words.
    With `search_done` (converged, or the space measured) the time the search did not
    need goes to more confirmation rounds (`rounds_that_fit`)."""
    budget = ctx.study.budget
    if not budget.ablation_repeats and not budget.confirm_repeats:
        return "off (budget.ablation_repeats = 0)"
    if not _claim(ctx, take_over):
        return "another worker runs it"
    if budget.confirm_repeats:
        rounds = rounds_that_fit(ctx) if search_done else budget.confirm_repeats
        more = (f" ({rounds} rounds: the search ended early, its time goes to them)"
                if rounds > budget.confirm_repeats else "")
        say("the contenders for the best measured again, in rounds" + more)
        say(f"confirmation: {run_confirmation(ctx, rounds)}")
    say("ablation of the best configuration")
    return run_ablation(ctx)


def rounds_that_fit(ctx: TunerState) -> int:
    """Confirmation rounds that fit the time left beside the ablation, from
    budget.confirm_repeats to MAX_ROUNDS."""
    budget = ctx.study.budget
    records = ctx.run.store.records()
    each = trial_seconds(records)
    per_round = round_trials(ctx, records)
    if each is None or not per_round:
        return budget.confirm_repeats
    ablation = MARGIN * each * budget.ablation_repeats * ablation_round_trials(ctx)
    fit = int((ctx.clock.left() - ablation) // (MARGIN * each * per_round))
    return max(budget.confirm_repeats, min(MAX_ROUNDS, fit))


def _claim(ctx: TunerState, take_over: bool) -> bool:
    """Last writer wins, after a pause long enough for every claim to land."""
    study, me = ctx.optuna_study, ctx.me
    owner = Worker.parse(study.user_attrs.get(OWNER))
    if owner is not None and owner != me and owner.alive() and not take_over:
        return False
    study.set_user_attr(OWNER, me.tag)
    time.sleep(CLAIM_PAUSE_S)
    return study.user_attrs.get(OWNER) == me.tag
