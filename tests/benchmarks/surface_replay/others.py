"""The space's truth, and the two strategies the harness is judged against.

    enumerate_space   every configuration's plan and noise-free figures (surface.truth);
                      the best is the fastest ok one within the study's memory budget
    run_random        configurations drawn uniformly from the space, without replacement,
                      each measured in full (repeat 0)
    run_estimator     a seeded sample of SAMPLE configurations, ranked by the estimator's
                      predicted samples/s (those predicted to fit the memory budget, by
                      the correction the tuner uses before any trial), fastest first, ties
                      in a seeded random order; measured in full in that order
    optuna_samplers   Optuna's own samplers (TPE, GPSampler, BoTorchSampler), which
                      harness_run.run_seed runs through the real Tuner in the harness's place

Each trial costs what the harness's would: the helper's PREPARE_S, the launcher's
OVERHEAD_S and the surface's wall_s. A configuration counts as found when it ran ok,
its measured peak within the budget, and its noise-free samples/s is >= the goal.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import Any

import optuna

from tests.benchmarks.surface_replay.harness_run import HOUR, Run, Setup
from tests.benchmarks.surface_replay.launcher import OVERHEAD_S
from tests.benchmarks.surface_replay.world import PREPARE_S
from training_harness.core.errors import HarnessError
from training_harness.study.search_space import SearchSpace

SAMPLE = 1000


@dataclass
class Space:
    params: list[dict[str, Any]]
    plans: list[dict[str, Any]]
    rates: list[float]  # noise-free samples/s of an ok configuration within the budget, else 0
    best: float
    unconstrained_best: float  # ok, over the budget or not
    statuses: dict[str, int]


def listed(space: SearchSpace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every configuration's parameters and plan (a family's surfaces share them)."""
    params = space.enumerate()
    return params, [space.plan(p).to_dict() for p in params]


def enumerate_space(space: SearchSpace, truth: Any, budget_bytes: int,
                    given: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
                    ) -> Space:
    params, plans = given or listed(space)
    rates, statuses = [], {}
    best_any = 0.0
    for plan in plans:
        t = truth(plan)
        statuses[t["status"]] = statuses.get(t["status"], 0) + 1
        ok = t["status"] == "ok"
        best_any = max(best_any, t["samples_per_s"] if ok else 0.0)
        rates.append(t["samples_per_s"] if ok and t["peak_memory_bytes"] <= budget_bytes
                     else 0.0)
    return Space(params, plans, rates, max(rates), best_any, statuses)


def _measure_in_order(setup: Setup, space: Space, order: list[int], until_hour: bool) -> Run:
    run, spent = Run(), 0.0
    budget = setup.checked.budget_bytes
    for i in order:
        out = setup.surface(space.plans[i], 0)
        spent += PREPARE_S + OVERHEAD_S + out["wall_s"]
        run.launched += 1
        if out["status"] == "ok" and (out.get("peak_memory_bytes") or 0) <= budget:
            rate = space.rates[i]
            if rate > run.curve[-1][1]:
                run.curve.append((spent, rate))
            if rate >= setup.goal and run.reached_s is None:
                run.reached_s = spent
        if run.reached_s is not None and (not until_hour or spent >= HOUR):
            break
    run.stopped = "goal reached" if run.reached_s is not None else "order exhausted"
    return run


def run_random(setup: Setup, space: Space, seed: int) -> Run:
    order = list(range(len(space.plans)))
    random.Random(seed).shuffle(order)
    return _measure_in_order(setup, space, order, until_hour=True)


def predicted_rates(setup: Setup, space: Space, indices: list[int]) -> dict[int, float]:
    """The estimator's samples/s for `indices` (the torch-side helper's prepare, cached);
    those refused here or predicted over the memory budget left out."""
    from training_harness.tune.model.correction import Correction

    fresh = Correction.from_records([], setup.checked.device_type)
    peaks = setup.checked.facts.peaks
    out = {}
    for i in indices:
        plan = setup.checked.space.plan(space.params[i])
        try:
            predicted = setup.helper.prepare(plan, peaks).predicted or {}
        except HarnessError:
            continue
        peak, step = fresh.peak_memory(predicted), predicted.get("step_time_s")
        if step and (peak is None or peak <= setup.checked.budget_bytes):
            out[i] = plan.batch_size / step
    return out


def run_estimator(setup: Setup, space: Space, seed: int) -> Run:
    rng = random.Random(seed)
    indices = rng.sample(range(len(space.plans)), min(SAMPLE, len(space.plans)))
    rates = predicted_rates(setup, space, indices)
    order = list(rates)
    rng.shuffle(order)  # ties in a seeded order
    order.sort(key=lambda i: -rates[i])
    return _measure_in_order(setup, space, order, until_hour=False)


def optuna_samplers(seed: int, names: tuple[str, ...] = ("tpe", "gp", "botorch")
                    ) -> dict[str, Any]:
    """The samplers a user of this field would otherwise run, with Optuna 5's defaults:
    TPE (multivariate, constant liar: Optuna 5's TPESampler() is both), GPSampler, and
    BoTorchSampler where optuna-integration and botorch are installed (the [replay] extra)."""
    # GPSampler and BoTorchSampler sample a conditional setting (fused.attention exists only
    # with fused on) with their independent sampler, as the study's space presents it
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    makers = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed),
              "gp": lambda: optuna.samplers.GPSampler(seed=seed,
                                                      warn_independent_sampling=False)}
    try:
        from optuna_integration import BoTorchSampler
    except ImportError:
        pass
    else:
        makers["botorch"] = lambda: BoTorchSampler(seed=seed)
    return {n: makers[n]() for n in names if n in makers}
