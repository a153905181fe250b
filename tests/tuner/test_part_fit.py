"""The estimator's step parts re-weighted by the study's measurements
(training_harness.tune.model.part_fit): a machine that breaks one of the estimator's assumptions
is learned as that part's weight, from a few trials."""

from __future__ import annotations

import math
import random

import pytest

from training_harness.tune.model.part_fit import PartFit


def _trials(n: int, truth: dict[str, float], seed: int = 0, noise: float = 0.03):
    """`n` plans' predicted parts (seconds) and their steps on a machine whose parts take
    `truth` x the prediction, with a few percent of noise."""
    rng = random.Random(seed)
    rows, steps = [], []
    for _ in range(n):
        p = {"compute": rng.uniform(0.2, 1.0), "recompute": rng.choice([0.0, 0.3]),
             "launches": rng.uniform(0.0, 0.4), "data": rng.uniform(0.0, 0.2),
             "optimizer": 0.05}
        k = {name: truth.get(name, 1.0) for name in p}
        busy = k["compute"] * p["compute"] + k["recompute"] * p["recompute"]
        step = max(busy, k["launches"] * p["launches"]) + k["data"] * p["data"] \
            + k["optimizer"] * p["optimizer"]
        rows.append(p)
        steps.append(step * math.exp(rng.gauss(0.0, noise)))
    return rows, steps


def test_nothing_measured_corrects_nothing():
    fit = PartFit([], [])
    assert fit.n == 0
    assert fit.ratio({"compute": 1.0, "data": 0.5}) == 1.0


def test_a_link_fifteen_times_slower_is_learned_from_a_few_trials():
    """A PCIe node under an NVLink datasheet: the data-parallel part is 15x, the compute
    1.3x. Eight trials give the data part within 20% and the compute within 25% (the
    prior ties the two a little: PART_SD), and a chatty plan's corrected step within
    10%."""
    rows, steps = _trials(8, {"compute": 1.3, "recompute": 1.3, "data": 15.0})
    fit = PartFit(rows, steps)
    w = fit.weights()
    assert w["compute"] == pytest.approx(1.3, rel=0.25)
    assert w["data"] == pytest.approx(15.0, rel=0.2)
    chatty = {"compute": 0.5, "data": 0.2, "optimizer": 0.05}
    true = 1.3 * 0.5 + 15.0 * 0.2 + 0.05
    assert fit.ratio(chatty) * 0.75 == pytest.approx(true, rel=0.1)


def test_a_part_no_trial_exercises_moves_with_the_compute():
    """No trial had tensor-parallel traffic: its weight follows the machine's common
    ratio (the compute's), not 1 and not the data part's departure."""
    rows, steps = _trials(10, {"compute": 2.0, "recompute": 2.0, "launches": 2.0,
                               "optimizer": 2.0, "data": 6.0})
    w = PartFit(rows, steps).weights()
    assert w["tensor"] == pytest.approx(w["compute"], rel=0.05)
    assert w["compute"] == pytest.approx(2.0, rel=0.1)


def test_an_estimator_that_is_right_stays_right():
    rows, steps = _trials(12, {})
    fit = PartFit(rows, steps)
    assert all(v == pytest.approx(1.0, abs=0.12) for v in fit.weights().values())


def test_the_sampler_s_cost_model_re_weights_what_the_trials_measured():
    """The GuidedSampler's cost model over a real search space: the estimator's launches
    are a tenth of this machine's, so it ties the micro-batch sizes that are launch-bound
    here. After trials at each micro-batch size (no checkpointing), its prior for every
    configuration, the checkpointed ones too, follows the true step within 15%, and it
    says what it re-weighted."""
    from types import SimpleNamespace

    import optuna

    from tests.tuner.conftest import study_table
    from training_harness.study.search_space import SearchSpace
    from training_harness.study.space_sampling import key
    from training_harness.study.study_file import Study
    from training_harness.tune.model.correction import Correction
    from training_harness.tune.model.estimator_model import EstimatorCostModel, Predictions

    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")

    def parts(plan):
        return {"compute": 0.2, "recompute": 0.03 if plan.strategies.get("checkpoint") else 0,
                "launches": 0.004 * 64 / plan.micro_batch_size}

    def true_step(plan):  # launch-bound at micro-batches 4 and 8, compute-bound at 16
        p = parts(plan)
        return max(p["compute"] + p["recompute"], 10 * p["launches"])

    class TorchHelper:
        def prepare(self, plan, peaks, phases=None):
            p = parts(plan)
            return SimpleNamespace(predicted={
                "step_time_s": max(p["compute"] + p["recompute"], p["launches"]),
                "peak_memory_bytes": 1e8, "step_parts": p})

    every = space.enumerate()
    plain = [p for p in every if not space.plan(p).strategies.get("checkpoint")]
    measured = [next(p for p in plain if p["micro_batch_size"] == m) for m in (4, 8, 16)]
    facts = SimpleNamespace(peaks={}, resolved=lambda plan: plan)
    model = EstimatorCostModel(space, Predictions(space, facts, TorchHelper()),
                               lambda: Correction(), 1e9, seed=0, pool_size=64)
    study = optuna.create_study(direction="maximize")
    for p in measured:
        plan = space.plan(p)
        study.add_trial(optuna.trial.create_trial(
            params=p, distributions=space.distributions(p),
            values=[plan.batch_size / true_step(plan)]))
    model.candidates(study)
    assert any(space.plan(p).strategies.get("checkpoint") for p in every)
    for p in every:
        plan = space.plan(p)
        assert model.prior(p) == pytest.approx(plan.batch_size / true_step(plan), rel=0.15), \
            (key(p), model.learnt())
    assert "launches x" in model.learnt()
