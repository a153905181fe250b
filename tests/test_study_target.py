"""A study that searches time to a target loss: the global batch, the optimizer, the lr,
its scaling and warm-up become parameters, every plan carries its [target], and the
study file's mistakes say what to change."""

from __future__ import annotations

import pytest

from training_harness.core.errors import HarnessError
from training_harness.study.search_space import SearchSpace, Wanted
from training_harness.study.study_file import Study


def table(**changes):
    t = {"name": "ttl", "device": "cpu", "objective": "time_to_loss", "target_loss": 2.5,
         "global_batch_size": [16, 64], "micro_batch_sizes": [16],
         "workload": {"name": "gpt", "layers": 1, "hidden": 32, "heads": 2, "seq_len": 32,
                      "vocab": 256, "data": "text"},
         "target": {"optimizer": ["adamw", "lamb"], "lr_scaling": ["sqrt"], "base_batch": 16,
                    "seeds": [0, 1], "max_samples": 4096, "eval_every": 512}}
    t.update(changes)
    return t


def test_the_space_of_a_time_to_loss_study():
    study = Study.from_dict(table())
    assert study.directions == ["minimize"]
    space = SearchSpace.of(study, "cpu")
    configs = space.enumerate()
    assert len(configs) == 4  # 2 global batches x 2 optimizers
    plans = [space.plan(c) for c in configs]
    seen = {(p.batch_size, "lamb" in p.strategies) for p in plans}
    assert seen == {(16, False), (16, True), (64, False), (64, True)}
    for p in plans:
        assert p.target.loss == 2.5 and p.target.seeds == [0, 1]
        assert p.target.lr_scaling == "sqrt" and p.target.base_batch == 16
        assert ("accumulation" in p.strategies) == (p.batch_size == 64)
    # the baseline's parameters: the first of each list
    base = space.plan(space.params_for(Wanted()))
    assert base.batch_size == 16 and "lamb" not in base.strategies


def test_an_lr_range_is_searched_log_uniformly():
    study = Study.from_dict(table(target={"lr": {"min": 1e-4, "max": 1e-2}}))
    space = SearchSpace.of(study, "cpu")
    assert space.size() is None  # a range: not a grid
    params = space.params_for(Wanted())
    assert params["lr"] == study.optimizer.lr and space.plan(params).optimizer.lr == 1e-3


def test_each_optimizer_its_own_lr():
    study = Study.from_dict(table(target={"optimizer": ["adamw", "lamb"],
                                          "lr": {"adamw": [1e-3], "lamb": [1e-2, 2e-2]}}))
    space = SearchSpace.of(study, "cpu")
    plans = [space.plan(c) for c in space.enumerate()]
    lrs = {("lamb" in p.strategies, p.optimizer.lr) for p in plans}
    assert lrs == {(False, 1e-3), (True, 1e-2), (True, 2e-2)}
    with pytest.raises(HarnessError, match="a list for each optimizer"):
        Study.from_dict(table(target={"optimizer": ["adamw", "lamb"], "lr": {"adamw": [1e-3]}}))


@pytest.mark.parametrize("change, words", [
    ({"target_loss": None}, "needs the validation loss"),
    ({"objective": "throughput", "target_loss": None}, "searching the global batch"),
    ({"strategies": {"lamb": {}}}, "remove \\[strategies.lamb\\]"),
    ({"target": {"lr_scaling": ["linear"]}}, "base_batch"),
    ({"target": {"optimizer": ["sgd"]}}, "optimizer"),
    ({"target_loss": float("nan")}, "target_loss"),
])
def test_study_mistakes(change, words):
    t = table(**change)
    t = {k: v for k, v in t.items() if v is not None}
    with pytest.raises(HarnessError, match=words):
        Study.from_dict(t)


@pytest.mark.parametrize("name", ["time-to-loss-cpu", "time-to-loss-1gpu"])
def test_the_shipped_time_to_loss_studies_are_valid(name):
    from pathlib import Path

    from training_harness.study.checks import check_study

    study = Study.from_toml(Path(__file__).parent.parent / "studies" / f"{name}.toml")
    check_study(study, study.device)
    assert study.objectives == ["time_to_loss"] and len(study.global_batches) >= 5
