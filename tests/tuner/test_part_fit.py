"""The estimator's step parts re-weighted by the study's measurements
(harness.tune.search.part_fit): a machine that breaks one of the estimator's assumptions
is learned as that part's weight, from a few trials."""

from __future__ import annotations

import math
import random

import pytest

from harness.tune.search.part_fit import PartFit


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
    1.3x. Eight trials give both within 15%, and a plan's corrected step follows."""
    rows, steps = _trials(8, {"compute": 1.3, "recompute": 1.3, "data": 15.0})
    fit = PartFit(rows, steps)
    w = fit.weights()
    assert w["compute"] == pytest.approx(1.3, rel=0.15)
    assert w["data"] == pytest.approx(15.0, rel=0.15)
    chatty = {"compute": 0.5, "data": 0.2, "optimizer": 0.05}
    true = 1.3 * 0.5 + 15.0 * 0.2 + 0.05
    assert fit.ratio(chatty) * 0.75 == pytest.approx(true, rel=0.15)


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
