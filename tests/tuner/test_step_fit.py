"""The step-time correction learns per factor from the study's own trials: on a surface
whose truth is known, its error on the configurations not yet measured falls as trials
come in, and the expected duration of a compiled trial is kept apart."""

from __future__ import annotations

import math
import random
import statistics

from tests.tuner.test_search_at_scale import wide_space
from training_harness.study.space_sampling import sample
from training_harness.tune.model.correction import Correction
from training_harness.tune.model.step_fit import StepFit, factors


def predicted_step(plan: dict) -> float:
    """An estimator that knows FLOPs only: time proportional to the batch's work."""
    return 1e-3 * plan["global_batch_size"]


def true_step(plan: dict) -> float:
    """What the machine does: launch-bound small micro-batches, bf16 faster, the fused
    kernels faster, checkpointing's recompute slower (unknown to the estimator)."""
    s = plan["strategies"]
    t = predicted_step(plan) * 1.7 * (1 + 4 / plan["micro_batch_size"])
    t *= 0.6 if "amp" in s else 1.0
    t *= 0.8 if "fused" in s else 1.0
    t *= 1.3 if "checkpoint" in s else 1.0
    return t


def record(plan: dict, duration_s: float = 10.0) -> dict:
    return {"status": "ok", "plan": plan, "duration_s": duration_s,
            "predicted": {"step_time_s": predicted_step(plan)},
            "metrics": {"step_time_s": {"median": true_step(plan)}}}


def test_the_error_on_unmeasured_configurations_falls_as_trials_come_in():
    space = wide_space()
    plans = [space.plan(p).to_dict() for p in sample(space, random.Random(0), 200)]
    trials, held_out = plans[:40], plans[40:]

    def error(n: int) -> float:
        fit = Correction.from_records([record(p) for p in trials[:n]], "cpu")
        return statistics.median(abs(fit.step_time(record(p)["predicted"], p) / true_step(p)
                                     - 1) for p in held_out)

    errors = [error(n) for n in (1, 4, 10, 40)]
    assert errors[0] > 0.2  # one ratio for all: the factors' spread is not learnt
    assert errors[-1] < 0.05 and errors[-1] < errors[1] < errors[0], errors


def test_one_trial_gives_the_common_ratio_and_unknown_factors_weigh_nothing():
    space = wide_space()
    plan = space.plan(sample(space, random.Random(3), 1)[0]).to_dict()
    fit = StepFit([(plan, 2.0, 1.0)])
    # the surrogate keeps the noise it assumes (15% in log units): within 1% of the ratio
    assert math.isclose(fit.ratio(plan), 2.0, rel_tol=0.01) and fit.ratio(None) == 2.0
    other = {**plan, "strategies": {**plan["strategies"], "never-seen": {}}}
    assert math.isclose(fit.ratio(other), 2.0, rel_tol=0.01)
    assert "never-seen" in factors(other) and "accumulation" not in factors(other)


def test_compiled_trials_are_expected_to_take_their_own_overhead():
    space = wide_space()
    plain = space.plan(sample(space, random.Random(4), 1)[0]).to_dict()
    plain["strategies"] = {"fused": {"attention": "sdpa", "compile": False}}
    built = {**plain, "strategies": {"fused": {"attention": "sdpa", "compile": True}}}
    steps = plain["warmup_steps"] + plain["steps"]
    recs = [record(plain, duration_s=5.0 + steps * true_step(plain)),
            record(built, duration_s=65.0 + steps * true_step(built))]
    fit = Correction.from_records(recs, "cuda")
    assert math.isclose(fit.overhead_s, 5.0) and math.isclose(fit.overhead_compiled_s, 65.0)
    before = Correction.from_records(recs[:1], "cuda")  # no compiled trial measured yet
    extra = before.trial_seconds({"step_time_s": 0.0}, steps, "cuda", built) - \
        before.trial_seconds({"step_time_s": 0.0}, steps, "cuda", plain)
    assert extra == 70.0  # DEFAULT_COMPILE_S["cuda"] until a compiled trial says


def test_expected_trial_counts_the_cuda_window_least_duration():
    """On CUDA the measured window lasts at least 2 s: a 10 ms step runs 220 steps, not
    the plan's 10, and the tuner expects that time (training_harness.core.window)."""
    plan = {"warmup_steps": 3, "steps": 10, "strategies": {}}
    fresh = Correction(overhead_s=5.0)
    short = fresh.trial_seconds({"step_time_s": 0.01}, 13, "cuda", plan)
    assert math.isclose(short, 5.0 + (3 + 220) * 0.01)
    long = fresh.trial_seconds({"step_time_s": 1.0}, 13, "cuda", plan)
    assert math.isclose(long, 5.0 + 13 * 1.0)  # 10 steps last longer than 2 s already
    assert math.isclose(fresh.trial_seconds({"step_time_s": 0.01}, 13, "cpu", plan),
                        5.0 + 13 * 0.01)  # no least duration off CUDA
    own = {**plan, "min_window_s": 0.0}
    assert math.isclose(fresh.trial_seconds({"step_time_s": 0.01}, 13, "cuda", own),
                        5.0 + 13 * 0.01)


def test_overhead_is_fitted_on_the_steps_the_record_ran():
    plan = {"warmup_steps": 3, "steps": 10, "strategies": {}}
    ran = {"status": "ok", "plan": plan, "duration_s": 5.0 + (12 + 220) * 0.01,
           "predicted": {"step_time_s": 0.01},
           "metrics": {"step_time_s": {"median": 0.01}, "loss": {"warmup_steps": 12},
                       "window": {"steps": 220}}}
    fit = Correction.from_records([ran], "cuda")
    assert math.isclose(fit.overhead_s, 5.0)


def test_every_searchable_setting_of_every_strategy_is_a_factor():
    """The tuner reads SETTINGS without importing the strategies (torch): each searchable
    setting must be in it, or the correction and the search's model cannot tell its values
    apart (the float8 recipe, checkpoint's policy and compile_mode could not)."""
    from training_harness.strategies.registry import all_strategies
    from training_harness.tune.model.step_fit import SETTINGS

    searchable = {(s.name, key) for s in all_strategies() for key in s.space()}
    assert {key for _, key in searchable} <= set(SETTINGS), sorted(
        (n, k) for n, k in searchable if k not in SETTINGS)
    plan = {"micro_batch_size": 8, "strategies": {
        "float8": {"recipe": "rowwise"}, "checkpoint": {"every": 1, "policy": "selective"}}}
    assert {"float8.recipe=rowwise", "checkpoint.policy=selective"} <= set(factors(plan))
