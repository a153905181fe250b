"""Which sampler a study gets: the GuidedSampler over the estimator for one throughput
objective, else TPE, NSGA-II or random (docs/tuning.md, "How it searches").
"""

from __future__ import annotations

import warnings

import optuna

from training_harness.study.study_file import Study
from training_harness.tune.search.guided_sampler import CostModel, GuidedSampler


def startup_trials(space_size: int | None) -> int:
    """TPE's random start-up trials: fewer on a small space."""
    return 10 if space_size is None else max(3, min(10, space_size // 6))


def make_sampler(study: Study, space_size: int | None,
                 cost_model: CostModel | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler: for one throughput objective (sampler "auto" or "tpe") with a
    cost model, the GuidedSampler over it with TPE as its fallback; else TPE, NSGA-II,
    random."""
    kind = study.sampler
    if kind == "auto":
        kind = "tpe" if len(study.objectives) == 1 else "nsga2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if kind == "tpe":
            # Fewer random start-up trials on a small space; multivariate TPE with
            # groups models the conditional parameters (a setting only when on).
            startup = startup_trials(space_size)
            tpe = optuna.samplers.TPESampler(seed=study.seed, multivariate=True, group=True,
                                             constant_liar=True, n_startup_trials=startup)
            if cost_model is None or study.objectives != ["throughput"]:
                return tpe
            return GuidedSampler(cost_model, fallback=tpe, seed=study.seed)
        if kind == "nsga2":
            size = 20 if space_size is None else max(4, min(50, space_size // 4))
            return optuna.samplers.NSGAIISampler(seed=study.seed, population_size=size)
    return optuna.samplers.RandomSampler(seed=study.seed)  # random, and grid's leftovers
