"""What the search queues by its own rules, beside the sampler's proposals.

    after a repeat proposal     the unmeasured neighbour of the best (one choice changed;
                                two, when every one-choice neighbour was measured) that
                                the estimator, corrected by the study's trials so far
                                (harness.tune.search.correction), predicts fastest
    after a trial over memory   the same configuration one micro-batch smaller, else with
                                activation checkpointing (an OOM, a measured peak over the
                                budget, or a prediction over it): the next trial this
                                worker runs, ahead of anything queued

    after each trial            once MODEL_AFTER trials are measured, the unmeasured
                                configuration the corrected estimator predicts fastest
                                (of a sample of the space and the best's neighbours),
                                when it predicts it MIN_GAIN faster than the best
                                measured and its recent predictions were right
                                (`trusted`): each trial corrects the next prediction

None lists the space (harness.study.space_sampling walks from one configuration), so
both work at any size. Either trial carries the user attribute "queued_because". A
neighbour is a WAITING trial (phase "search"), queued only while none waits.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import optuna
from optuna.trial import TrialState

from harness.core.errors import HarnessError
from harness.core.plan import Plan
from harness.records.tags import tags_of
from harness.study.machine_facts import MachineFacts
from harness.study.search_space import SearchSpace, config_key
from harness.study.space_sampling import key, neighbours, smaller
from harness.tune.search.correction import Correction
from harness.tune.search.sampling import memory_excess_bytes
from harness.tune.tuner_state import TunerState

MODEL_AFTER = 4  # measured trials before the corrected estimator picks configurations
MIN_GAIN = 0.03  # it picks one predicted at least this much faster than the best measured
RECENT, TRUSTED_ERROR = 3, 0.15  # it picks while its last 3 predictions erred <= 15%


def resolved_key(facts: MachineFacts, plan: Plan) -> str:
    """A plan's configuration as the trial will run it (every setting filled in)."""
    return config_key(facts.resolved(plan))


class Predictions:
    """The estimator's predictions, asked of the torch-side helper once per configuration;
    the study's correction is applied afresh each time (it changes as trials come in)."""

    def __init__(self, space: SearchSpace, facts: MachineFacts, torch_helper: Any):
        self.space, self.facts, self.torch_helper = space, facts, torch_helper
        self._raw: dict[str, dict[str, Any] | None] = {}  # by resolved configuration
        self._plans: dict[Any, tuple[Plan, dict[str, Any], str]] = {}  # by parameters
        # rates under one correction (a new one comes with each measured trial)
        self._rates: dict[str, float] = {}
        self._rates_of: Correction | None = None

    def _plan(self, params: dict[str, Any]) -> tuple[Plan, dict[str, Any], str]:
        try:  # the parameters' values are scalars: a tuple hashes faster than JSON
            k: Any = tuple(sorted(params.items()))
            hash(k)
        except TypeError:
            k = key(params)
        if k not in self._plans:
            plan = self.space.plan(params)
            self._plans[k] = (plan, plan.to_dict(), resolved_key(self.facts, plan))
        return self._plans[k]

    def raw(self, params: dict[str, Any]) -> tuple[Plan, dict[str, Any] | None]:
        """The plan of `params` and the estimator's prediction (None: refused here)."""
        plan, _, k = self._plan(params)
        if k not in self._raw:
            try:
                prepared = self.torch_helper.prepare(plan, self.facts.peaks)
                self._raw[k] = dict(prepared.predicted or {})
            except HarnessError:
                self._raw[k] = None
        return plan, self._raw[k]

    def rate(self, params: dict[str, Any], correction: Correction,
             budget_bytes: float) -> float:
        """Predicted samples/s of `params`, corrected; 0 where it cannot be predicted or
        is predicted over the memory budget."""
        if correction is not self._rates_of:
            self._rates, self._rates_of = {}, correction
        plan, as_dict, k = self._plan(params)
        if k not in self._rates:
            predicted = self.raw(params)[1]
            step = correction.step_time(predicted, as_dict) if predicted else None
            peak = correction.peak_memory(predicted)
            over = peak is not None and peak > budget_bytes
            self._rates[k] = 0.0 if not step or over else plan.batch_size / step
        return self._rates[k]

    def fresh(self, ctx: TunerState, params: dict[str, Any], running: set[str]) -> bool:
        """Not measured yet, nor running (its plan walked once)."""
        k = self._plan(params)[2]
        return k not in ctx.measured and k not in running


def model_pick(ctx: TunerState, running: set[str], predictions: Predictions,
               pool: list[dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """Once MODEL_AFTER trials are measured: the unmeasured configuration of `pool` (and
    the neighbours of the best) that the corrected estimator predicts fastest, when it
    predicts it MIN_GAIN faster than the best measured; None otherwise (the sampler
    proposes). Throughput studies only."""
    objectives = ctx.study.objectives
    best = ctx.best_trial()
    if objectives != ["throughput"] or best is None or _waiting(ctx):
        return None
    correction = ctx.correction()
    if correction.n_time < MODEL_AFTER or not trusted(ctx.run.store.records()):
        return None
    fresh = [p for p in pool + neighbours(ctx.space, best.params)
             if predictions.fresh(ctx, p, running)]
    if not fresh:
        return None
    rate, first = max((predictions.rate(p, correction, ctx.run.budget_bytes), -i)
                      for i, p in enumerate(fresh))
    top = fresh[-first]  # the first of the fastest, in the pool's order
    if rate < best.values[0] * (1 + MIN_GAIN):
        return None
    return top, (f"predicted {rate:.4g} samples/s by the estimator corrected from "
                 f"{correction.n_time} trials (best measured {best.values[0]:.4g})")


def trusted(records: list[dict[str, Any]]) -> bool:
    """Whether the corrected estimator was right lately: over the last RECENT measured
    trials, the step time each was predicted before it ran is within TRUSTED_ERROR of
    what it measured (median). A model that has just been wrong lets TPE propose until
    the trials it learns from set it right."""
    errors = []
    for r in reversed(records):
        predicted = (r.get("predicted") or {}).get("corrected_step_time_s")
        measured = ((r.get("metrics") or {}).get("step_time_s") or {}).get("median")
        if r.get("status") == "ok" and predicted and measured and \
                "duplicate_of" not in tags_of(r):
            errors.append(abs(predicted / measured - 1))
            if len(errors) == RECENT:
                break
    return len(errors) == RECENT and statistics.median(errors) <= TRUSTED_ERROR


def neighbour_of_best(ctx: TunerState, running: set[str], rng: random.Random,
                      predictions: Predictions) -> bool:
    """Queue the unmeasured neighbour of the best trial predicted fastest; whether one
    was queued."""
    best = ctx.best_trial()
    if best is None or _waiting(ctx):
        return False
    near = neighbours(ctx.space, best.params)
    for ring in (near, [q for p in near for q in neighbours(ctx.space, p)]):
        fresh = [p for p in ring if predictions.fresh(ctx, p, running)]
        if fresh:
            rng.shuffle(fresh)  # ties in a seeded order
            correction = ctx.correction()
            pick = max(fresh, key=lambda p: predictions.rate(p, correction,
                                                               ctx.run.budget_bytes))
            return _enqueue(ctx, pick, f"a neighbour of trial "
                                       f"{best.user_attrs.get('trial_id')}")
    return False


def smaller_after(ctx: TunerState, record: dict[str, Any], running: set[str],
                  predictions: Predictions) -> tuple[dict[str, Any], str] | None:
    """After a trial over the memory budget: its configuration needing less memory (not
    measured yet), and why, to run next (`start`)."""
    number = tags_of(record).get("optuna_number")
    if number is None or memory_excess_bytes(record, ctx.run.budget_bytes) <= 0:
        return None
    params = ctx.storage.get_trial(ctx.storage_id(number)).params
    less = smaller(ctx.space, params)
    if less is None or not predictions.fresh(ctx, less, running):
        return None
    return less, f"trial {record['trial_id']} went over the memory budget"


def start(ctx: TunerState, params: dict[str, Any], why: str) -> optuna.Trial:
    """A search trial of `params`, RUNNING and this worker's from the first moment (as
    ask() would give it, without waiting behind the queue)."""
    used = ctx.space.distributions(params)
    number = ctx.start_trial({k: params[k] for k in used}, used,
                             {"phase": "search", "queued_because": why})
    return optuna.Trial(ctx.optuna_study, ctx.storage_id(number))


def _waiting(ctx: TunerState) -> bool:
    return bool(ctx.optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _enqueue(ctx: TunerState, params: dict[str, Any], why: str) -> bool:
    ctx.optuna_study.enqueue_trial(params, user_attrs={"phase": "search",
                                                       "queued_because": why})
    return True
