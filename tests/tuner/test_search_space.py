"""The conditional search space: layouts that divide, micro-batches that divide the
global batch, a strategy's settings only when it is on."""

from __future__ import annotations

import optuna
import pytest

from tests.tuner.conftest import study_table
from training_harness.core.errors import HarnessError
from training_harness.study import references
from training_harness.study.search_space import SearchSpace, config_key
from training_harness.study.study_file import Study

WIDE = {
    "layout": {"world_sizes": [1, 2, 4], "pipeline": [1, 2], "tensor": [1, 2]},
    "global_batch_size": 8,
    "micro_batch_sizes": [1, 2, 4, 8],
    "strategies": {
        "ddp": {"search": ["compression"]},
        "zero": {"search": ["stage"]},
        "pipeline": {"search": ["schedule"]},
        "tensor": {"search": []},
        "amp": {"values": {"dtype": ["bf16"]}},
        "fused": {"search": ["attention", "optimizer"]},
        "checkpoint": {"values": {"every": [1, 2]}},
    },
}


def wide_space() -> SearchSpace:
    table = study_table()
    table.update(WIDE)
    table["workload"]["tie_weights"] = False  # else every pipeline layout is refused, left out
    return SearchSpace.of(Study.from_dict(table), "cpu")


def check_plan(space: SearchSpace, plan, params) -> None:
    lay, s = plan.layout, plan.strategies
    assert lay.world_size in space.study.layout.world_sizes
    assert space.study.global_batch_size % (plan.micro_batch_size * lay.data) == 0
    assert ("pipeline" in s) == (lay.pipeline > 1)
    assert ("tensor" in s) == (lay.tensor > 1)
    assert bool({"ddp", "zero"} & s.keys()) == (lay.data > 1)
    assert not {"ddp", "zero"} <= s.keys()
    accumulate = plan.accumulation_steps > 1 and "pipeline" not in s
    assert ("accumulation" in s) == accumulate
    for name in params:  # a setting only when its strategy is on
        strategy, _, setting = name.partition("@")[0].partition(".")  # @layout: its own
        if setting:
            assert strategy in s and s[strategy][setting] == params[name]
    for name in ("amp", "fused", "checkpoint"):
        assert (name in s) == params[name]


def test_every_configuration_divides_and_is_conditional():
    space = wide_space()
    configs = space.enumerate()
    keys = {config_key(space.plan(p)) for p in configs}
    assert len(keys) == len(configs) > 100
    for params in configs:
        check_plan(space, space.plan(params), params)
        assert space.distributions(params).keys() == params.keys()
    layouts = {(p.layout.data, p.layout.pipeline, p.layout.tensor)
               for p in map(space.plan, configs)}
    assert (1, 2, 2) in layouts and (4, 1, 1) in layouts and (2, 2, 1) in layouts
    assert all(d * p * t in (1, 2, 4) for d, p, t in layouts)


def test_sampled_trials_follow_the_same_rules():
    space = wide_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(60):
        trial = study.ask()
        plan = space.suggest(trial)
        check_plan(space, plan, trial.params)
        assert space.plan(trial.params).to_dict() == plan.to_dict()
        study.tell(trial, 1.0)


def test_micro_batch_choices_depend_on_the_data_size():
    space = wide_space()
    names = {k for p in space.enumerate() for k in p if k.startswith("micro_batch_size")}
    # data 1, 2, 4 allow different micro-batches: one parameter per data size
    assert names == {"micro_batch_size@data1", "micro_batch_size@data2",
                     "micro_batch_size@data4"}
    assert [m for m in space.study.micro_sizes if 8 % (m * 4) == 0] == [1, 2]


def test_baseline_and_known_good():
    space = wide_space()
    base = space.plan(space.params_for(references.baseline(space)))
    assert base.layout.data == 4 and base.layout.world_size == 4
    assert set(base.strategies) == {"ddp"} and base.micro_batch_size == 2
    good = space.plan(space.params_for(references.known_good(space)))
    assert "fused" in good.strategies and "amp" not in good.strategies  # CPU: fused only
    quick = SearchSpace.of(Study.from_dict(study_table()), "cpu")
    assert quick.plan(quick.params_for(references.baseline(quick))).strategies == {}
    assert quick.size() == 3 * 5 * 2 * 2


def test_values_a_device_cannot_run_are_left_out():
    table = study_table()
    table["strategies"] = {"amp": {}, "fused": {"search": ["layernorm"]}}
    space = SearchSpace.of(Study.from_dict(table), "cpu")
    assert space.settings["amp"].searched["dtype"].values == ("bf16",)  # fp16 needs CUDA
    assert "triton" not in space.settings["fused"].searched["layernorm"].values
    assert any("fp16" in why for why in space.settings["amp"].left_out)


def test_known_good_must_be_in_the_space():
    table = study_table(known_good={"strategies": {"fused": {"optimizer": "default"}}})
    space = SearchSpace.of(Study.from_dict(table), "cpu")
    with pytest.raises(Exception, match="fused.optimizer"):
        space.params_for(references.known_good(space))


def test_grid_needs_choices_only(tmp_path, capsys):
    from tests.tuner.conftest import tune, write_study

    table = study_table(sampler="grid")
    table["strategies"] = {"amp": {"values": {"init_scale": {"low": 1.0, "high": 8.0}},
                                   "search": ["init_scale"]}}
    code = tune(str(write_study(tmp_path, table)), "--out", str(tmp_path / "run"))
    assert code == 2 and "grid" in capsys.readouterr().err


def test_layouts_need_their_strategies():
    from training_harness.study.checks import check_study

    table = study_table(layout={"world_sizes": [2], "tensor": [2]})
    with pytest.raises(HarnessError, match=r"strategies\.tensor"):
        check_study(Study.from_dict(table), "cpu")


def test_the_tuner_fills_in_settings_as_the_trial_will():
    """The tuner writes a plan's settings out in full without torch (MachineFacts.resolved,
    from the probe's defaults) to spot a configuration measured before; that must give
    what strategies.resolved gives in the trial, or repeats would run twice (or worse,
    two different configurations would share one record)."""
    from training_harness.measure.torch_helper_server import study_facts
    from training_harness.strategies.compose import resolved
    from training_harness.study.machine_facts import MachineFacts

    table = study_table()
    table.update(WIDE)
    study = Study.from_dict(table)
    facts = MachineFacts.from_json(study_facts(study.to_dict()))
    space = wide_space()
    plans = [space.plan(p) for p in space.enumerate()]
    assert len(plans) > 50
    for plan in plans:
        assert config_key(facts.resolved(plan)) == config_key(resolved(plan)), plan.strategies
