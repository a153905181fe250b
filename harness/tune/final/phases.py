"""After the search: the variants, the confirmation rounds, then the ablation, run by
one worker.

When the search ended early (converged, or its space measured) the time it did not
need goes, in a budget of an hour or more, first to the best's variants (the
precisions and compile modes the space left out, training_harness.tune.final.variants), then
to more confirmation rounds, those beyond budget.confirm_repeats with windows
LONGER_WINDOW times as long (less noise on the figures that name the best). In any
budget, where the rounds asked for leave the verdict open (the best not told apart from
a rival or from the baseline at this n), further rounds of those run while they fit
beside the ablation (FinalTime.extra_round_fits), up to confirmation.MAX_EXTRA_ROUNDS.

Of the workers sharing a study, the one holding the study's claim (the storage's
user attribute "ablation_owner") runs them; `--resume` takes the claim over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock
from training_harness.tune.final.ablation import run_ablation
from training_harness.tune.final.confirmation import run_confirmation
from training_harness.tune.final.extra_trial import ExtraTrials
from training_harness.tune.final.time_reserve import LONGER_WINDOW, FinalTime
from training_harness.tune.final.variants import VARIANTS_KEY, run_variants
from training_harness.tune.recorder import Measured
from training_harness.tune.study_trials import StudyTrials
from training_harness.tune.trial_job import TrialRunner
from training_harness.tune.workers import Worker

VARIANTS_MIN_BUDGET_S = 3600.0  # shorter studies keep their spare time for the rounds
OWNER = "ablation_owner"  # the storage's user attribute naming the worker that runs them
CLAIM_PAUSE_S = 1.0  # between writing the claim and reading it back


def run_final_phases(study: Study, space: SearchSpace, run: TrialRunner, clock: Clock,
                     optuna_study: optuna.Study, trials: StudyTrials, measured: Measured,
                     extra: ExtraTrials, me: Worker, take_over: bool,
                     say: Callable[[str], None], on_event: Callable[[str, dict[str, Any]], None],
                     search_done: bool = False, spent: dict[str, float] | None = None) -> str:
    """Measure the contenders again, then ablate the best; how the ablation ended, in words.
    With `search_done` (converged, or the space measured) the time the search did not
    need goes to the variants and to more confirmation rounds (`rounds_that_fit`).
    `spent` gets each phase's seconds. `extra` runs each phase's trials."""
    budget = study.budget
    if not budget.ablation_repeats and not budget.confirm_repeats:
        return "off (budget.ablation_repeats = 0)"
    if not _claim(optuna_study, me, take_over):
        return "another worker runs it"
    spent = spent if spent is not None else {}
    left = FinalTime(study, space, clock, run.store, run.budget_bytes, trials)
    if search_done and budget.variants and clock.budget_s >= VARIANTS_MIN_BUDGET_S:
        say("the best with the precisions and compile modes the search left out")
        began = time.time()
        ran = run_variants(trials, run, measured, extra, fits=left.variant_fits)
        spent["variants"] = time.time() - began
        optuna_study.set_user_attr(VARIANTS_KEY, ran.as_dict())  # study.json's "variants"
        say(f"variants: {len(ran.ran)} measured, {len(ran.refused)} not possible here; "
            f"{ran.ended}")
    if budget.confirm_repeats:
        rounds = left.rounds_that_fit() if search_done else budget.confirm_repeats
        more = (f" ({rounds} rounds: the search ended early, its time goes to them; those "
                f"beyond {budget.confirm_repeats} with {LONGER_WINDOW}x longer windows)"
                if rounds > budget.confirm_repeats else "")
        say("the contenders for the best measured again, in rounds" + more)
        began = time.time()
        ended = run_confirmation(study, run.store, run.budget_bytes, optuna_study, clock,
                                 extra, on_event, rounds, longer=LONGER_WINDOW,
                                 more=left.extra_round_fits)
        say(f"confirmation: {ended}")
        spent["confirmation"] = time.time() - began
    say("ablation of the best configuration")
    began = time.time()
    ended = run_ablation(trials.best_trial(), space, budget.ablation_repeats, run.store,
                         clock, extra)
    spent["ablation"] = time.time() - began
    return ended


def _claim(optuna_study: optuna.Study, me: Worker, take_over: bool) -> bool:
    """Last writer wins, after a pause long enough for every claim to land."""
    owner = Worker.parse(optuna_study.user_attrs.get(OWNER))
    if owner is not None and owner != me and owner.alive() and not take_over:
        return False
    optuna_study.set_user_attr(OWNER, me.tag)
    time.sleep(CLAIM_PAUSE_S)
    return optuna_study.user_attrs.get(OWNER) == me.tag
