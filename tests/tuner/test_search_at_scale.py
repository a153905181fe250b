"""The search's own rules at any size of space: a sample instead of a list, the
neighbours of the best, and memory as a measured quantity (an OOM queues the same
configuration one micro-batch smaller)."""

from __future__ import annotations

import json
import random

import optuna
import pytest

from tests.tuner import fake_launch
from tests.tuner.conftest import SEARCH_ONLY, records, study_table, write_study
from training_harness.cli.main import main
from training_harness.core.device import RuntimeEnv
from training_harness.study.search_space import SearchSpace, config_key
from training_harness.study.space_sampling import complete, key, neighbours, sample, smaller
from training_harness.study.study_file import Study

CPU = RuntimeEnv("cpu", "cpu", 1, bf16=True, triton=False)


def wide_space() -> SearchSpace:
    """The quickstart space widened: 7 micro-batch sizes, LAMB, more fused settings
    (2,744 on a CPU: the Triton kernels are refused here)."""
    table = study_table(global_batch_size=64, micro_batch_sizes=[1, 2, 4, 8, 16, 32, 64])
    table["strategies"]["fused"] = {"search": ["attention", "optimizer", "layernorm",
                                               "gelu", "cross_entropy"]}
    table["strategies"]["lamb"] = {"search": []}
    return SearchSpace.of(Study.from_dict(table), "cpu")


def test_a_sample_needs_no_list_of_the_space(monkeypatch):
    space = wide_space()
    size = space.size()
    assert size > 2000
    monkeypatch.setattr(SearchSpace, "enumerate", lambda self: pytest.fail("listed"))
    drawn = sample(space, random.Random(0), 64)
    assert len(drawn) == 64 and len({key(p) for p in drawn}) == 64
    plans = {config_key(space.plan(p)) for p in drawn}
    assert len(plans) == 64  # distinct configurations, each one the space can propose
    assert sample(space, random.Random(0), 64) == drawn  # seeded


def test_a_days_study_ranks_a_space_of_thousands_whole():
    """A day's budget buys a prediction of each of 2,880 configurations (8-16 ms each),
    all of this space of 2,744: a best the estimator ranks low is a candidate from the
    start (drawn-0 of the replay's family). A 4-minute study still ranks a sample."""
    from training_harness.tune.model.estimator_model import first_guess_pool, sample_size

    space = wide_space()
    listed = first_guess_pool(space, 0, sample_size(24 * 3600))
    assert len(listed) == space.size() == len({key(p) for p in listed})
    assert len(first_guess_pool(space, 0, sample_size(240))) == 64 + 2  # a sample


def test_a_sample_of_a_space_with_ranges():
    """A learning rate searched as a range: the space has no size, a sample still works."""
    table = study_table(objective="time_to_loss", target_loss=5.0)
    table["target"] = {"lr": {"min": 1e-4, "max": 1e-2}}
    space = SearchSpace.of(Study.from_dict(table), "cpu")
    assert space.size() is None
    drawn = sample(space, random.Random(1), 10)
    lrs = [space.plan(p).optimizer.lr for p in drawn]
    assert len(set(lrs)) == 10 and all(1e-4 <= lr <= 1e-2 for lr in lrs)


def test_check_says_how_a_large_study_starts(tmp_path, capsys):
    table = study_table(global_batch_size=64, micro_batch_sizes=[1, 2, 4, 8, 16, 32, 64])
    table["strategies"]["fused"] = {"search": ["attention", "optimizer", "layernorm",
                                               "gelu", "cross_entropy"]}
    table["strategies"]["lamb"] = {"search": []}
    path = write_study(tmp_path, table)
    assert main(["tune", str(path), "--out", str(tmp_path / "run"), "--check"]) == 0
    start = next(line for line in capsys.readouterr().out.splitlines()
                 if line.strip().startswith("start"))
    assert ("2 reference(s), then the GuidedSampler over a sample of 64 of 2,744 "
            "configurations, 8 more each trial: the estimator's fastest first" in start), start
    assert "one micro-batch smaller" in start and "expected improvement" in start


def test_neighbours_differ_in_one_choice():
    space = wide_space()
    base = complete(space, sample(space, random.Random(2), 1)[0])
    near = neighbours(space, base)
    assert near and base not in near
    for p in near:
        changed = {k for k in base.keys() & p.keys() if base[k] != p[k]}
        # one choice; a strategy turned on or off brings or takes its settings with it
        assert len(changed) == 1 or (changed == set() and p.keys() != base.keys()), (base, p)
    every = {key(p) for p in space.enumerate()}
    assert all(key(p) in every for p in near)


def test_smaller_steps_the_micro_batch_down_then_checkpoints():
    space = wide_space()
    params = complete(space, {"micro_batch_size": 16, "checkpoint": False, "amp": True,
                              "fused": False, "lamb": False})
    assert smaller(space, params) == {**params, "micro_batch_size": 8}
    least = complete(space, {**params, "micro_batch_size": 1})
    on = smaller(space, least)
    assert on["checkpoint"] is True and on["micro_batch_size"] == 1
    assert smaller(space, on) is None  # nothing smaller is offered


def oom_above_8(prep, out_dir, command, **kw):
    """The fake launcher, but a micro-batch above 8 without checkpointing runs out of
    memory (as a GPU would: the record says oom, with the peak it reached)."""
    result = fake_launch.launch(prep, out_dir, command, **kw)
    if prep.plan.micro_batch_size > 8 and "checkpoint" not in prep.plan.strategies:
        result.status, result.reason = "oom", "CUDA out of memory (fake)"
        result.metrics["samples_per_s"] = None
        result.write(out_dir / "result.json")
    return result


def test_an_oom_queues_the_same_configuration_one_micro_batch_smaller(tmp_path):
    out = tmp_path / "run"
    path = write_study(tmp_path, study_table(budget=SEARCH_ONLY))
    launcher = f"{__name__}:oom_above_8"
    assert main(["tune", str(path), "--out", str(out), "--n-trials", "6",
                 "--launcher", launcher, "--quiet"]) == 0
    recs = records(out)
    baseline = next(r for r in recs if r["tags"]["phase"] == "baseline")
    assert baseline["status"] == "oom" and baseline["plan"]["micro_batch_size"] == 16
    assert baseline["metrics"]["memory_excess_bytes"] >= 2**20  # how far over: kept
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(out / "optuna.journal")))
    trials = optuna.load_study(study_name="quickstart", storage=storage).trials
    queued = [t for t in trials if "less memory" in t.user_attrs.get("guided_by", "")]
    assert queued, [t.user_attrs for t in trials]
    first = queued[0]  # the first trial the sampler chose: right after the references
    before = next(r for r in recs if r["tags"]["optuna_number"] == first.number - 1)
    assert before["status"] == "oom" and before["tags"]["phase"] != "search"
    ran = next(r for r in recs if r["trial_id"] == first.number)
    assert ran["plan"]["micro_batch_size"] == 8

    def techniques(r):  # accumulation follows from the micro-batch size
        return {k: v for k, v in r["plan"]["strategies"].items() if k != "accumulation"}
    assert techniques(ran) == techniques(before)
    # Optuna was told how far over, in bytes
    told = next(t for t in trials if t.number == baseline["tags"]["optuna_number"])
    assert told.constraints["memory"] >= 2**20


def test_a_search_that_ends_early_gives_its_time_to_more_confirmation_rounds(tmp_path,
                                                                             capsys):
    """Four configurations, measured in seconds of a minute's budget: the rest of the
    budget goes to confirmation rounds (up to MAX_ROUNDS), and the summary says how the
    time went."""
    from training_harness.tune.final.time_reserve import MAX_ROUNDS

    table = study_table(micro_batch_sizes=[8, 16], budget={"time": "60s",
                                                          "ablation_repeats": 1})
    table["strategies"] = {"amp": table["strategies"]["amp"]}
    out = tmp_path / "run"
    path = write_study(tmp_path, table)
    assert main(["tune", str(path), "--out", str(out), "--launcher",
                 "tests.tuner.fake_launch:launch", "--quiet"]) == 0
    said = capsys.readouterr().out
    recs = records(out)
    rounds = {r["tags"]["confirm"]["round"] for r in recs if r["tags"]["phase"] == "confirm"}
    assert rounds == set(range(MAX_ROUNDS)), rounds
    info = json.loads((out / "study.json").read_text())
    assert info["stopped_because"].startswith("search space exhausted")
    # a minute's budget: no variants (those wait for an hour or more), then each phase
    assert set(info["time_spent"]) == {"search", "confirmation", "ablation"}
    assert "time: search " in said and "of the budget unused" in said


def test_the_corrected_estimator_picks_the_next_trial():
    """After a few measured trials the next is the unmeasured configuration the corrected
    estimator predicts fastest: here the estimator ignores bf16, which halves the step on
    this machine; four measured trials (one with bf16) teach the GuidedSampler's surrogate
    that, and its pick is the fastest configuration not yet measured, which the raw
    estimator would not rank first."""
    from types import SimpleNamespace

    from training_harness.tune import GuidedSampler
    from training_harness.tune.model.correction import Correction
    from training_harness.tune.model.estimator_model import EstimatorCostModel, Predictions

    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")

    def raw_step(plan):  # FLOPs only: micro-batch 16 a little faster, nothing else seen
        return {4: 0.12, 8: 0.11, 16: 0.10}[plan.micro_batch_size]

    def true_step(plan):
        return raw_step(plan) * (0.5 if "amp" in plan.strategies else 1.0)

    class TorchHelper:
        def prepare(self, plan, peaks, phases=None):
            return SimpleNamespace(predicted={"step_time_s": raw_step(plan),
                                              "peak_memory_bytes": 1e8})

    every = space.enumerate()
    measured = [p for p in every if not p["fused"] and not p["checkpoint"]
                and p["micro_batch_size"] in (4, 8)]  # amp on and off, micro 4 and 8
    rate = {key(p): space.plan(p).batch_size / true_step(space.plan(p)) for p in every}
    facts = SimpleNamespace(peaks={}, resolved=lambda plan: plan)
    model = EstimatorCostModel(space, Predictions(space, facts, TorchHelper()),
                               lambda: Correction(), 1e9, seed=0, pool_size=64)
    sampler = GuidedSampler(model, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for p in measured:
        study.add_trial(optuna.trial.create_trial(
            params=p, distributions=space.distributions(p), values=[rate[key(p)]]))
    trial = study.ask()
    plan = space.suggest(trial)
    assert plan.strategies.get("amp") is not None and plan.micro_batch_size == 16
    pick = dict(trial.params)
    assert rate[key(pick)] == max(rate[key(p)] for p in every if p not in measured)
    assert "expected improvement" in study.trials[-1].user_attrs["guided_by"]
