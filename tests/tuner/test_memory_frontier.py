"""The memory frontier (docs/tuning.md, "How it searches"): a configuration predicted a
little over the budget, within the spread of the study's measured memory ratios, is a
candidate weighted by its chance to fit (EI x P(fits)); further over, it is refused."""

from __future__ import annotations

import math

import optuna
import pytest

from harness.tune import GuidedSampler, SimpleCostModel
from harness.tune.search.correction import FRONTIER, MEMORY_SD, Correction, memory_spread

optuna.logging.set_verbosity(optuna.logging.WARNING)
GIB = 2**30


def test_the_ratio_spread_is_wide_while_few_and_learnt_from_the_measured_ratios():
    assert memory_spread([]) == memory_spread([1.2]) == MEMORY_SD
    steady = memory_spread([1.0, 1.01, 0.99, 1.0, 1.02, 0.98] * 4)
    scattered = memory_spread([1.3, 0.8, 1.25, 0.85, 1.2, 0.9] * 4)
    assert steady < MEMORY_SD / 2 and scattered > MEMORY_SD


def test_the_chance_to_fit_is_one_half_at_the_budget_and_refuses_beyond_the_spread():
    c = Correction(runtime_bytes=2 * GIB, memory_ratio=1.25, memory_sd=0.1, n_memory=3)
    at = {"peak_memory_bytes": 48 * GIB}  # 2 + 1.25 x 48 = 62 GiB
    assert c.fit_chance(at, 62 * GIB) == pytest.approx(0.5)
    slightly = c.fit_chance(at, 58 * GIB)  # over by 4 GiB: log(56/60) = -0.07, within 0.1
    far = c.fit_chance(at, 50 * GIB)  # over by 12 GiB: -0.22, beyond one sd
    assert FRONTIER < slightly < 0.5 and far < FRONTIER
    assert c.fit_chance({"peak_memory_bytes": None}, GIB) == 1.0


def test_expected_improvement_is_weighted_by_the_chance_to_fit():
    # "big" is predicted 20% faster but fits one time in ten; "small" surely fits.
    grid = [{"c": "big"}, {"c": "small"}, {"c": "slow"}]
    rates = {"big": 1.2, "small": 1.0, "slow": 0.2}

    class Model(SimpleCostModel):
        def fits(self, params):
            return 0.1 if params["c"] == "big" else 1.0

    sampler = GuidedSampler(Model(lambda p: rates[p["c"]], grid), seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"c": "slow"})
    study.optimize(lambda t: rates[t.suggest_categorical("c", ["big", "small", "slow"])],
                   n_trials=1)
    nxt = study.ask()
    assert nxt.suggest_categorical("c", ["big", "small", "slow"]) == "small"
    assert math.isfinite(study.trials[0].value)
