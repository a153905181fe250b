"""LARS, Muon and weight averaging beside AdamW and LAMB: each a distinct maths key in the
steps-to-target cache, the [target] optimizer choices, the estimator's state bytes."""

from __future__ import annotations

import pytest
import torch

from tests.estimator.models import CPU, TinyGPTWorkload, expected_parameters, gpt_plan
from tests.test_study_target import table
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.target import maths_key
from training_harness.estimator import estimate
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def key(strategies):
    p = Plan(workload="gpt", micro_batch_size=8, global_batch_size=16,
             strategies={"accumulation": {}, **strategies})
    return maths_key(p.to_dict(), 0, "cpu")


def test_each_technique_and_setting_has_its_own_maths_key():
    variants = [
        {}, {"lamb": {}}, {"lars": {}}, {"lars": {"momentum": 0.95}},
        {"lars": {"trust_coefficient": 0.01}}, {"muon": {}}, {"muon": {"momentum": 0.9}},
        {"muon": {"adjust_lr": "original", "lr_ratio": 20.0}},
        {"averaging": {}}, {"averaging": {"method": "swa"}}, {"averaging": {"decay": 0.99}},
        {"averaging": {}, "lars": {}}, {"averaging": {}, "muon": {}},
    ]
    keys = [key(v) for v in variants]
    assert len(set(keys)) == len(keys)
    # how the update runs leaves the key alone, as do strategies that only speed it up
    assert key({"lars": {}, "fused": {"optimizer": "foreach"}}) == key({"lars": {}})
    assert key({"muon": {}, "checkpoint": {}}) == key({"muon": {}})
    assert key({"averaging": {}, "checkpoint": {}}) == key({"averaging": {}})


def test_lars_and_muon_are_target_optimizer_choices_with_their_own_lr():
    study = Study.from_dict(table(
        global_batch_size=[16],
        target={"optimizer": ["adamw", "lars", "muon"],
                "lr": {"adamw": [1e-3], "lars": [1.0, 2.0], "muon": [2e-3]}}))
    space = SearchSpace.of(study, "cpu")
    plans = [space.plan(c) for c in space.enumerate()]
    seen = {(tuple(sorted(set(p.strategies) & {"lamb", "lars", "muon"})), p.optimizer.lr)
            for p in plans}
    assert seen == {((), 1e-3), (("lars",), 1.0), (("lars",), 2.0), (("muon",), 2e-3)}


@pytest.mark.parametrize("name", ["lars", "muon"])
def test_an_optimizer_strategy_beside_target_loss_is_refused(name):
    with pytest.raises(HarnessError, match=rf"remove \[strategies.{name}\]"):
        Study.from_dict(table(strategies={name: {}}))


def test_the_estimator_counts_each_optimizers_state():
    w = TinyGPTWorkload()
    psi = expected_parameters(w)
    h, layers = w.shape.hidden, w.shape.layers
    hidden = layers * 12 * h * h  # qkv, proj and the MLP's two matrices of every block

    def state(**strategies):
        return estimate(gpt_plan(**strategies), w, CPU).memory["optimizer_state"]

    assert state() == state(lamb={}) == 8 * psi  # two moments
    assert state(lars={}) == 4 * psi  # one momentum buffer
    assert state(muon={}) == 4 * hidden + 8 * (psi - hidden)  # Muon's buffer, AdamW's two
    assert state(averaging={}) == 8 * psi + 4 * psi  # the averages beside AdamW's moments
    text = " ".join(estimate(gpt_plan(muon={}), w, CPU).assumptions)
    assert "Muon's momentum buffer" in text
