"""After the search: the variants, the confirmation rounds, then the ablation, run by
one worker.

When the search ended early (converged, or its space measured) the time it did not
need goes, in a budget of an hour or more, first to the best's variants (the
precisions and compile modes the space left out, harness.tune.final.variants), then
to more confirmation rounds, those beyond budget.confirm_repeats with windows
LONGER_WINDOW times as long (less noise on the figures that name the best). In any
budget, where the rounds asked for leave the verdict open (the best not told apart from
a rival or from the baseline at this n), further rounds of those run while they fit
beside the ablation (`extra_round_fits`), up to confirmation.MAX_EXTRA_ROUNDS.

Of the workers sharing a study, the one holding the study's claim (the storage's
user attribute "ablation_owner") runs them; `--resume` takes the claim over.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from harness.tune.budget import MARGIN
from harness.tune.final.ablation import run_ablation
from harness.tune.final.confirmation import run_confirmation, window_s
from harness.tune.final.time_reserve import (
    ablation_round_trials,
    final_trials,
    round_trials,
    trial_seconds,
)
from harness.tune.final.variants import VARIANTS_KEY, run_variants
from harness.tune.recovery.workers import Worker
from harness.tune.tuner_state import TunerState

MAX_ROUNDS = 10  # confirmation rounds, however much time is left
LONGER_WINDOW = 4  # the extra rounds' windows, times the contender's own
VARIANTS_MIN_BUDGET_S = 3600.0  # shorter studies keep their spare time for the rounds
OWNER = "ablation_owner"  # the storage's user attribute naming the worker that runs them
CLAIM_PAUSE_S = 1.0  # between writing the claim and reading it back


def run_final_phases(ctx: TunerState, take_over: bool, say: Callable[[str], None],
                     search_done: bool = False, spent: dict[str, float] | None = None) -> str:
    """Measure the contenders again, then ablate the best; how the ablation ended, in words.
    With `search_done` (converged, or the space measured) the time the search did not
    need goes to the variants and to more confirmation rounds (`rounds_that_fit`).
    `spent` gets each phase's seconds."""
    budget = ctx.study.budget
    if not budget.ablation_repeats and not budget.confirm_repeats:
        return "off (budget.ablation_repeats = 0)"
    if not _claim(ctx, take_over):
        return "another worker runs it"
    spent = spent if spent is not None else {}
    if search_done and budget.variants and ctx.clock.budget_s >= VARIANTS_MIN_BUDGET_S:
        say("the best with the precisions and compile modes the search left out")
        began = time.time()
        ran = run_variants(ctx, lambda: variant_fits(ctx))
        spent["variants"] = time.time() - began
        ctx.optuna_study.set_user_attr(VARIANTS_KEY, ran.as_dict())  # study.json's "variants"
        say(f"variants: {len(ran.ran)} measured, {len(ran.refused)} not possible here; "
            f"{ran.ended}")
    if budget.confirm_repeats:
        rounds = rounds_that_fit(ctx) if search_done else budget.confirm_repeats
        more = (f" ({rounds} rounds: the search ended early, its time goes to them; those "
                f"beyond {budget.confirm_repeats} with {LONGER_WINDOW}x longer windows)"
                if rounds > budget.confirm_repeats else "")
        say("the contenders for the best measured again, in rounds" + more)
        began = time.time()
        ended = run_confirmation(ctx, rounds, longer=LONGER_WINDOW,
                                 more=lambda trials: extra_round_fits(ctx, trials))
        say(f"confirmation: {ended}")
        spent["confirmation"] = time.time() - began
    say("ablation of the best configuration")
    began = time.time()
    ended = run_ablation(ctx)
    spent["ablation"] = time.time() - began
    return ended


def variant_fits(ctx: TunerState) -> bool:
    """Whether one more variant fits beside the confirmation and the ablation's trials."""
    records = ctx.run.store.records()
    each = trial_seconds(records)
    if each is None:
        return False
    return ctx.clock.left() >= MARGIN * each * (1 + final_trials(ctx, records))


def extra_round_fits(ctx: TunerState, trials: int) -> bool:
    """Whether a further confirmation round of `trials` trials, with LONGER_WINDOW times
    longer windows, fits in the time left beside the ablation."""
    budget = ctx.study.budget
    records = ctx.run.store.records()
    each = trial_seconds(records)
    if each is None:
        return False
    ablation = MARGIN * each * budget.ablation_repeats * ablation_round_trials(ctx)
    return ctx.clock.left() - ablation >= MARGIN * _longer_trial_s(records, each) * trials


def _longer_trial_s(records: list, each: float) -> float:
    """A trial's seconds when its window is LONGER_WINDOW times as long."""
    seconds = [window_s(r) for r in records if r["status"] == "ok" and window_s(r)]
    return each + (LONGER_WINDOW - 1) * (statistics.median(seconds) if seconds else 0.0)


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
    left = ctx.clock.left() - ablation - MARGIN * each * per_round * budget.confirm_repeats
    # the rounds beyond confirm_repeats measure LONGER_WINDOW times as long a window
    longer = _longer_trial_s(records, each)
    fit = budget.confirm_repeats + int(max(0.0, left) // (MARGIN * longer * per_round))
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
