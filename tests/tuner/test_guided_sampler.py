"""GuidedSampler in plain Optuna studies: the documented example, enqueued trials, the
constant liar, the memory step-down, and convergence that waits for the model's doubt."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from training_harness.tune import GuidedSampler, SimpleCostModel
from training_harness.tune.model.surrogate import Surrogate

optuna.logging.set_verbosity(optuna.logging.WARNING)

BATCH, LAYERS, KERNEL = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8), ("a", "b", "c")
GRID = [{"batch": b, "layers": n, "kernel": k} for b in BATCH for n in LAYERS for k in KERNEL]


def predicted(p):
    return p["batch"] / (1 + 0.1 * p["batch"]) / p["layers"]


def suggest(t):
    return {"batch": t.suggest_categorical("batch", BATCH),
            "layers": t.suggest_categorical("layers", LAYERS),
            "kernel": t.suggest_categorical("kernel", KERNEL)}


def test_the_documented_example_finds_what_the_prior_gets_wrong_and_stops():
    # The truth doubles kernel "b", which the prior cannot see; the prior's own pick is "a".
    def truth(p):
        return predicted(p) * (2.0 if p["kernel"] == "b" else 1.0)

    sampler = GuidedSampler(SimpleCostModel(predicted, GRID), seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: truth(suggest(t)), n_trials=40,
                   callbacks=[sampler.stop_when_converged])
    assert study.best_value == pytest.approx(max(truth(g) for g in GRID))
    assert sampler.converged and len(study.trials) < 40
    keys = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(set(keys)) == len(keys)  # nothing measured twice


def test_a_prior_wrong_by_3x_where_the_best_lies_does_not_converge_before_finding_it():
    # The prior ranks layers=8 last of the layers and kernel "c" below "a"; the truth is 3x
    # the prior at layers=8 and 2x with "c" (the estimator wrong on one factor, twice): the
    # best lies where the cost model ranks low, as on the held-out surface.
    shape = {1: 1.0, 2: 0.9, 4: 0.8, 8: 0.7}

    def prior(p):
        return predicted({**p, "layers": 1}) * shape[p["layers"]] * (1.1 if p["kernel"] == "a"
                                                                     else 1.0)

    def truth(p):
        return prior(p) * (3.0 if p["layers"] == 8 else 1.0) * (
            2.0 if p["kernel"] == "c" else 1.0)

    best = max(truth(g) for g in GRID)
    assert max(GRID, key=prior)["layers"] == 1
    for seed in range(5):
        sampler = GuidedSampler(SimpleCostModel(prior, GRID), seed=seed)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(lambda t: truth(suggest(t)), n_trials=len(GRID),
                       callbacks=[sampler.stop_when_converged])
        assert study.best_value == pytest.approx(best), seed
        assert len(study.trials) < len(GRID) / 2, seed  # and it did stop


def test_minimising_studies_rank_the_other_way():
    def seconds(p):
        return 1.0 / predicted(p)

    sampler = GuidedSampler(SimpleCostModel(seconds, GRID), seed=1)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.optimize(lambda t: seconds(suggest(t)), n_trials=3)
    assert study.trials[0].value == pytest.approx(min(seconds(g) for g in GRID))


def test_enqueued_trials_keep_their_parameters_and_running_ones_are_not_proposed_again():
    sampler = GuidedSampler(SimpleCostModel(predicted, GRID), seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"batch": 1, "layers": 8, "kernel": "c"})
    first = study.ask()
    assert suggest(first) == {"batch": 1, "layers": 8, "kernel": "c"}
    running = [study.ask() for _ in range(3)]  # none told yet: in flight
    seen = [tuple(sorted(suggest(t).items())) for t in running]
    assert len(set(seen)) == 3
    assert max(GRID, key=predicted) == dict(seen[0])  # the prior's best first


def test_a_trial_over_the_memory_constraint_is_followed_by_the_smaller_configuration():
    class Model(SimpleCostModel):
        def smaller(self, params):
            below = [b for b in BATCH if b < params["batch"]]
            return {**params, "batch": max(below)} if below else None

    sampler = GuidedSampler(Model(predicted, GRID), seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    trial = study.ask()
    params = suggest(trial)
    trial.set_constraint("memory", 1e9)  # over the budget
    study.tell(trial, 0.0)
    nxt = study.ask()
    assert suggest(nxt) == {**params, "batch": params["batch"] // 2}
    assert "less memory" in study.trials[nxt.number].user_attrs["guided_by"]


def test_the_surrogate_is_sure_where_it_measured_and_unsure_of_an_unseen_choice():
    rng = random.Random(0)
    rows = [{"kernel=a": 1.0, f"batch={b}": 1.0} for b in BATCH for _ in range(2)]
    y = [math.log(1.5) + rng.gauss(0, 0.02) for _ in rows]
    s = Surrogate(rows, y)
    (m_seen, m_new), (sd_seen, sd_new) = s.predict([{"kernel=a": 1.0, "batch=4": 1.0},
                                                    {"kernel=b": 1.0, "batch=4": 1.0}])
    assert m_seen == pytest.approx(math.log(1.5), abs=0.05)
    assert sd_seen < 0.2 < 0.5 < sd_new


def test_a_candidate_unlikely_to_fit_the_memory_budget_waits_for_the_likely_ones():
    """The expected improvement is weighed by the chance to fit (a cost model that knows
    memory, EstimatorCostModel, says it): the prior's fastest kernel "c", unlikely to fit,
    comes after every likely one of the same prior; certain to fit, it comes first."""

    class Memory(SimpleCostModel):
        chance = 0.01

        def fit_chance(self, params):
            return self.chance if params["kernel"] == "c" else 1.0

    def prior(p):
        return predicted(p) * (1.5 if p["kernel"] == "c" else 1.0)

    def first_kernels(chance):
        model = Memory(prior, GRID)
        model.chance = chance
        study = optuna.create_study(direction="maximize",
                                    sampler=GuidedSampler(model, seed=0))
        study.optimize(lambda t: prior(suggest(t)), n_trials=4)
        return [t.params["kernel"] for t in study.trials]

    assert first_kernels(1.0)[:2] == ["c", "c"]
    assert "c" not in first_kernels(0.01)[:4]


def test_the_chance_to_fit_is_the_corrected_peaks_lognormal_tail():
    from training_harness.tune.model import estimator_model as em

    class Fixed:
        def peak_memory(self, predicted):
            return predicted["peak"]

    predictions = em.Predictions.__new__(em.Predictions)
    predictions.raw = lambda params: (None, {"peak": params["peak"]})
    chance = [predictions.fit_chance({"peak": peak}, Fixed(), 100.0)
              for peak in (80.0, 100.0, 105.0, 100 * em.MEMORY_SLACK)]
    assert chance[0] > 0.99 and chance[1] == pytest.approx(0.5)
    assert 0.1 < chance[2] < 0.2 and chance[3] == pytest.approx(0.00135, rel=0.01)


def test_a_pick_is_kept_only_where_the_distribution_allows_it():
    """The sampler's test of a picked value, through Optuna's public distributions."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from training_harness.tune.search.guided_sampler import _allows

    assert _allows(CategoricalDistribution(["sdpa", None]), None)
    assert not _allows(CategoricalDistribution(["sdpa", "flex"]), "math")
    even = IntDistribution(2, 8, step=2)
    assert _allows(even, 6) and not _allows(even, 5)
    assert not _allows(IntDistribution(2, 8), 16)
    assert _allows(FloatDistribution(0, 1), 0.5) and not _allows(FloatDistribution(0, 1), 2.0)
