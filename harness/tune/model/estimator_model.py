"""The harness's cost model for the GuidedSampler: the estimator's samples/s (asked of the
torch-side helper once per configuration, 0.1-0.2 s) where its corrected peak fits the
memory budget, over the study's search space; docs/tuning.md ("How it searches").
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.study.machine_facts import MachineFacts
from training_harness.study.search_space import NotInSpace, SearchSpace, config_key
from training_harness.study.space_sampling import neighbours, sample, smaller
from training_harness.tune.model.correction import Correction
from training_harness.tune.model.part_fit import PartFit
from training_harness.tune.model.step_fit import factors

SAMPLE = 64  # the fewest configurations the estimator ranks (a short study's)
MOST = 8192  # the most (a long study's): a day's 2,880, all of a space that size
PER_PREDICTION_S = 30.0  # one more configuration ranked per this much of the budget


def sample_size(budget_s: float) -> int:
    """How many configurations the estimator ranks first: a day's study can spend a few
    minutes predicting."""
    return int(min(MOST, max(SAMPLE, budget_s // PER_PREDICTION_S)))


def first_guess_pool(space: SearchSpace, seed: int | None, n: int) -> list[dict[str, Any]]:
    """The configurations the estimator ranks first: all of a small space, else a
    seeded sample of `n` (and a few more, for the references it leaves out)."""
    size = space.size()
    if size is not None and size <= n + 2:
        return space.enumerate()
    return sample(space, random.Random(seed), n + 2)


# A corrected peak's error on a configuration not measured yet (log units): the GPU pages'
# raw errors were -0.6% to -10.6%, calibrated 2-3% on the measured ones. A configuration
# predicted just over the budget is a candidate, its expected improvement times its chance
# to fit (the best configurations often sit at the budget's edge: the family's drawn-0,
# whose corrected prediction put its best 12% over for the first trials); one predicted
# over by more than MEMORY_SLACK is not.
MEMORY_SD = 0.05
MEMORY_SLACK = math.exp(3 * MEMORY_SD)

GROW = 8  # configurations drawn afresh at each ask, so a large space is not judged on one sample
TOP = 3  # the measured configurations whose neighbours are always candidates
COVER = 8192  # a space this large is listed whole before the search may call itself done
WIDEN = 1024  # a larger one: this many more drawn each time it might be


def resolved_key(facts: MachineFacts, plan: Plan) -> str:
    """A plan's configuration as the trial will run it (every setting filled in)."""
    return config_key(facts.resolved(plan))


class Predictions:
    """The estimator's predictions, cached by resolved configuration."""

    def __init__(self, space: SearchSpace, facts: MachineFacts, torch_helper: Any):
        self.space, self.facts, self.torch_helper = space, facts, torch_helper
        self._raw: dict[str, dict[str, Any] | None] = {}  # by resolved configuration
        self._plans: dict[Any, tuple[Plan, dict[str, Any], str]] = {}  # by parameters

    def plan(self, params: dict[str, Any]) -> tuple[Plan, dict[str, Any], str]:
        """(plan, plan as a dict, resolved key) of `params`, walked once."""
        k: Any = tuple(sorted(params.items()))  # scalars: a tuple hashes faster than JSON
        if k not in self._plans:
            plan = self.space.plan(params)
            self._plans[k] = (plan, plan.to_dict(), resolved_key(self.facts, plan))
        return self._plans[k]

    def raw(self, params: dict[str, Any]) -> tuple[Plan, dict[str, Any] | None]:
        """The plan of `params` and the estimator's prediction (None: refused here)."""
        plan, _, k = self.plan(params)
        if k not in self._raw:
            try:
                prepared = self.torch_helper.prepare(plan, self.facts.peaks)
                self._raw[k] = dict(prepared.predicted or {})
            except HarnessError:
                self._raw[k] = None
        return plan, self._raw[k]

    def rate(self, params: dict[str, Any], correction: Correction, budget_bytes: float,
             slack: float = 1.0) -> float:
        """Predicted samples/s of `params` at the estimator's own step time (the sampler
        learns its error); 0 where it cannot be predicted or its peak, as `correction`
        corrects it, is over `slack` times the memory budget."""
        plan, predicted = self.raw(params)
        if not predicted:
            return 0.0
        step, peak = predicted.get("step_time_s"), correction.peak_memory(predicted)
        if not step or (peak is not None and peak > budget_bytes * slack):
            return 0.0
        return plan.batch_size / step

    def fit_chance(self, params: dict[str, Any], correction: Correction,
                   budget_bytes: float) -> float:
        """How likely `params` fits the memory budget: its corrected peak's error taken
        as lognormal, MEMORY_SD in log units (1 where no peak is predicted)."""
        predicted = self.raw(params)[1]
        peak = correction.peak_memory(predicted) if predicted else None
        if not peak or not budget_bytes:
            return 1.0
        z = math.log(budget_bytes / peak) / MEMORY_SD
        return 0.5 * math.erfc(-z / math.sqrt(2))


class EstimatorCostModel:
    """A training_harness.tune.search.guided_sampler.CostModel over a study's search space."""

    def __init__(self, space: SearchSpace, predictions: Predictions,
                 correction: Callable[[], Correction], budget_bytes: float,
                 seed: int | None, pool_size: int):
        self.space, self.predictions = space, predictions
        self.correction, self.budget_bytes = correction, budget_bytes
        self._rng = random.Random(seed)
        self._pool = first_guess_pool(space, seed, pool_size)
        self._now = correction()
        self._parts = PartFit([], [])  # refitted at each ask (candidates)
        size = space.size()
        self._exhaustive = size is not None and len(self._pool) >= size

    def candidates(self, study: Study) -> list[dict[str, Any]]:
        self._now = self.correction()  # one correction for this ask's priors
        if not self._exhaustive:
            self._pool += sample(self.space, self._rng, GROW)
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.values and t.params and all(v <= 0 for v in t.constraints.values())]
        throughput = len(study.directions) == 1 and study.direction.name == "MAXIMIZE"
        if len(study.directions) == 1:
            done.sort(key=lambda t: t.values[0], reverse=throughput)
        self._parts = self._fit_parts(done) if throughput else PartFit([], [])
        near = [p for t in done[:TOP] for p in neighbours(self.space, t.params)]
        return self._pool + near

    def _fit_parts(self, done: list[FrozenTrial]) -> PartFit:
        """The estimator's step parts re-weighted to the measured steps (samples/s trials)."""
        rows, steps = [], []
        for t in done:
            plan, predicted = self.predictions.raw(t.params)
            parts = (predicted or {}).get("step_parts")
            if parts and t.values[0] > 0:
                rows.append(parts)
                steps.append(plan.batch_size / t.values[0])
        return PartFit(rows, steps)

    def learnt(self) -> str:
        """The step parts the measured trials re-weighted by more than a fifth, in words."""
        moved = {p: w for p, w in self._parts.weights().items() if abs(math.log(w)) > 0.18}
        return ", ".join(f"{p} x{w:.2g}" for p, w in moved.items()) if self._parts.n else ""

    def prior(self, params: dict[str, Any]) -> float | None:
        rate = self.predictions.rate(params, self._now, self.budget_bytes, MEMORY_SLACK)
        if not rate or not self._parts.n:
            return rate or None
        parts = (self.predictions.raw(params)[1] or {}).get("step_parts")
        return rate / self._parts.ratio(parts) if parts else rate

    def fit_chance(self, params: dict[str, Any]) -> float:
        return self.predictions.fit_chance(params, self._now, self.budget_bytes)

    def features(self, params: dict[str, Any]) -> dict[str, float]:
        return factors(self.predictions.plan(params)[1])

    def key(self, params: dict[str, Any]) -> str | None:
        try:
            return self.predictions.plan(params)[2]
        except NotInSpace:  # a trial in flight whose parameters are not all suggested yet
            return None

    def smaller(self, params: dict[str, Any]) -> dict[str, Any] | None:
        return smaller(self.space, params)

    def neighbours(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return neighbours(self.space, params)

    def widen(self) -> bool:
        """All of a space of up to COVER configurations, else WIDEN more drawn up to COVER."""
        size = self.space.size()
        if self._exhaustive or len(self._pool) >= COVER:
            return False
        if size is not None and size <= COVER:
            self._pool, self._exhaustive = self.space.enumerate(), True
        else:
            self._pool += sample(self.space, self._rng, WIDEN)
        return True


def largest_fitting_micro(space: SearchSpace, params: dict[str, Any], torch_helper: Any,
                          facts: MachineFacts, budget_bytes: float) -> dict[str, Any]:
    """A reference's parameters with the largest micro-batch, no larger than its own,
    whose prediction (corrected as before any trial) fits the budget: the fp32 baseline's
    largest micro-batch often does not fit a GPU, and a baseline refused for memory leaves
    nothing to compare against. Unchanged where none fits or the plan is refused here."""
    name = next((k for k in params if k.startswith("micro_batch_size")), None)
    if name is None:
        return params
    predictions = Predictions(space, facts, torch_helper)
    fresh = Correction.from_records([], facts.device_type)
    sizes = [m for m in space.micros_for(space.plan(params).layout) if m <= params[name]]
    for micro in sorted(sizes, reverse=True):
        candidate = {**params, name: micro}
        predicted = predictions.raw(candidate)[1]
        if predicted is None:
            return params  # refused: its trial records why
        peak = fresh.peak_memory(predicted)
        if peak is None or peak <= budget_bytes:
            return candidate
    return params
