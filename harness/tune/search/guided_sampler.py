"""GuidedSampler: an Optuna sampler that ranks configurations by a cost model it corrects
from the study's own trials, explores where that model is unsure, and says when it is done.

Its rules (`_choose`), and an example of it in a plain Optuna study: docs/tuning.md ("How
it searches"). Enqueued trials keep their parameters.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from training_harness.tune.model.surrogate import Surrogate, expected_improvement, prob_above

FALLBACK_EVERY = 5  # one trial in five is the fallback's
MIN_OBSERVED = 6  # measured configurations before the fallback, and before convergence
PROB_STOP = 0.05  # converged: no candidate this likely to beat the best by the noise ...
EXPECTED_STOP = 0.5  # ... and fewer than this many expected to, over all candidates
NOISE = 0.03  # a gain this small is within run-to-run spread
TIME_FAILED_PAUSE = 10  # trials before a configuration that did not fit the time is tried again
PICK = "guided_by"  # the user attribute naming why the sampler chose a trial's parameters


class CostModel(Protocol):
    """What the sampler knows before measuring. Parameters are Optuna's, as a dict. A
    subclass may leave out `smaller` and `widen`."""

    def candidates(self, study: Study) -> list[dict[str, Any]]:
        """The configurations to rank now (may grow from call to call)."""

    def prior(self, params: dict[str, Any]) -> float | None:
        """Predicted objective value (> 0); None: predicted not to run or not to fit."""

    def features(self, params: dict[str, Any]) -> dict[str, float]:
        """What the prior's error may depend on: one-hot choices, log2 sizes."""

    def key(self, params: dict[str, Any]) -> str | None:
        """One configuration as run (two parameter sets may run the same); None for
        parameters that are not a whole configuration (a trial's, while suggested)."""

    def smaller(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """The same configuration needing less memory; None when there is none."""
        return None

    def fit_chance(self, params: dict[str, Any]) -> float:
        """How likely the configuration fits the memory budget (1: certain, or unknown)."""
        return 1.0

    def neighbours(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The configurations one choice away."""

    def widen(self) -> bool:
        """Draw more of the space into `candidates`, before the sampler may call the
        search converged; False when it lists every configuration, or as many as it
        ever will."""
        return False


class SimpleCostModel(CostModel):
    """A CostModel over a list of candidate parameter dicts and a prediction function:
    features are one-hot values (and log2 of positive numbers), neighbours differ in one
    value, and nothing is known of memory."""

    def __init__(self, predict: Callable[[dict[str, Any]], float | None],
                 candidates: Sequence[dict[str, Any]]):
        self.predict, self.pool = predict, [dict(c) for c in candidates]

    def candidates(self, study: Study) -> list[dict[str, Any]]:
        return self.pool

    def prior(self, params: dict[str, Any]) -> float | None:
        return self.predict(params)

    def features(self, params: dict[str, Any]) -> dict[str, float]:
        out = {f"{k}={v}": 1.0 for k, v in params.items()}
        for k, v in params.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                out[f"log2 {k}"] = math.log2(v)
        return out

    def key(self, params: dict[str, Any]) -> str:
        return json.dumps(params, sort_keys=True, default=str)

    def neighbours(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [c for c in self.pool
                if sum(c.get(k) != v for k, v in params.items()) == 1 and c.keys() == params.keys()]


def _allows(distribution: BaseDistribution, value: Any) -> bool:
    """Whether `value` is one of the distribution's (a conditional setting's distribution
    may differ from the pick's)."""
    try:
        distribution.to_internal_repr(value)  # a categorical's raises for a value not in it
    except (ValueError, TypeError):
        return False
    if isinstance(distribution, IntDistribution | FloatDistribution):
        step = distribution.step
        return distribution.low <= value <= distribution.high and (
            not step or math.isclose((value - distribution.low) / step,
                                     round((value - distribution.low) / step)))
    return True


class GuidedSampler(BaseSampler):
    def __init__(self, cost_model: CostModel, fallback: BaseSampler | None = None,
                 seed: int | None = None, noise: float = NOISE):
        self.cost_model = cost_model
        self.fallback = fallback or optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        self.noise = noise
        self._rng = random.Random(seed)
        self._picks: dict[int, tuple[dict[str, Any], str]] = {}  # trial number -> (params, why)
        self._decided: set[int] = set()
        self._chosen = 0  # trials this sampler decided (not enqueued ones)
        self._step_down: dict[str, Any] | None = None
        self._near_best = False
        self._noted: int | None = None  # the last finished trial _note_last acted on
        self.converged: str | None = None  # why the search may stop, once it may

    # A trial the sampler picked for takes its parameters from sample_independent.
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        mine = trial.number in self._picks
        return {} if mine else self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        mine = trial.number in self._picks
        return {} if mine else self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        params = self._picks.get(trial.number, ({}, ""))[0]
        if param_name in params:
            value = params[param_name]
            if _allows(param_distribution, value):
                return value
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)
        fresh = trial.state == TrialState.RUNNING and not trial.params
        if not fresh or trial.number in self._decided or "fixed_params" in trial.system_attrs:
            return  # a Trial object made again for a trial under way, or an enqueued one
        self._decided.add(trial.number)
        pick = self._choose(study)
        if pick is not None:
            self._picks[trial.number] = pick
            # The one place the harness reaches past Optuna's public API: a sampler's
            # before_trial gets a FrozenTrial, which has no setter, and Optuna's own
            # samplers write their attributes the same way (GridSampler, TPESampler,
            # CmaEsSampler: study._storage.set_trial_system_attr(trial._trial_id, ...)).
            study._storage.set_trial_user_attr(trial._trial_id, PICK, pick[1])

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.fallback.after_trial(study, trial, state, values)
        self._picks.pop(trial.number, None)

    def stop_when_converged(self, study: Study, trial: FrozenTrial) -> None:
        """A callback for `study.optimize`: stop once the sampler says it converged."""
        if self.converged:
            study.stop()

    def _choose(self, study: Study) -> tuple[dict[str, Any], str] | None:
        if len(study.directions) != 1:
            return None  # several objectives: the fallback's (NSGA-II) alone
        trials = study.get_trials(deepcopy=False)
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        observed, taken = self._observed(trials, sign)
        taken |= {self.cost_model.key(p) for p, _ in self._picks.values()}  # asked, not told
        self._note_last(trials)
        if self._step_down is not None:
            params, self._step_down = self._step_down, None
            if self.cost_model.key(params) not in taken:
                return params, "the same configuration needing less memory after one over it"
        self._chosen += 1
        if len(observed) >= MIN_OBSERVED and self._chosen % FALLBACK_EVERY == 0:
            return None
        best = max(observed.values(), key=lambda o: o[1], default=None)
        pool = self.cost_model.candidates(study)
        if self._near_best and best is not None:
            self._near_best = False
            near = self._rank(self.cost_model.neighbours(best[0]), observed, taken, sign, best)
            if near is not None:
                return near[0], f"a neighbour of the best ({near[1]})"
        return self._rank(pool, observed, taken, sign, best, judge=True)

    def _observed(self, trials: list[FrozenTrial], sign: float
                  ) -> tuple[dict[str, tuple[dict[str, Any], float]], set[str]]:
        """Measured feasible configurations (key -> (params, the median of sign x log of
        its measurements)), and every configuration measured, queued or in flight (the
        constant liar); one whose trial failed (for lack of time) only while recent."""
        scores: dict[str, tuple[dict[str, Any], list[float]]] = {}
        taken: set[str] = set()
        recent = {t.number for t in trials[-TIME_FAILED_PAUSE:]}
        for t in trials:
            params = t.params or t.system_attrs.get("fixed_params")
            k = self.cost_model.key(params) if params else None
            if k is None or (t.state == TrialState.FAIL and t.number not in recent):
                continue  # None: in flight, its parameters not all suggested yet
            taken.add(k)
            feasible = all(v <= 0 for v in (t.constraints or {}).values())
            if t.state == TrialState.COMPLETE and feasible and t.values and t.values[0] > 0:
                scores.setdefault(k, (params, []))[1].append(sign * math.log(t.values[0]))
        return {k: (p, float(np.median(v))) for k, (p, v) in scores.items()}, taken

    def _note_last(self, trials: list[FrozenTrial]) -> None:
        """What the last finished trial asks for next: a step down after one over memory,
        the best's neighbours after a repeat of a configuration measured before."""
        done = [t for t in trials if t.state.is_finished() and t.params]
        if not done or done[-1].number == self._noted:
            return
        last = done[-1]
        self._noted = last.number
        if (last.constraints or {}).get("memory", 0) > 0:
            self._step_down = self.cost_model.smaller(last.params)
        k = self.cost_model.key(last.params)
        if k is not None and any(self.cost_model.key(t.params) == k for t in done[:-1]):
            self._near_best = True

    def _rank(self, pool: list[dict[str, Any]], observed: dict, taken: set[str], sign: float,
              best: tuple[dict[str, Any], float] | None, judge: bool = False
              ) -> tuple[dict[str, Any], str] | None:
        """The fresh candidate with the highest expected improvement, and why; with
        `judge`, also whether the search has converged."""
        model = self.cost_model
        fresh, seen = [], set(taken)
        for params in pool:
            k = model.key(params)
            if k and k not in seen and (prior := model.prior(params)):
                fresh.append((params, sign * math.log(prior)))
            seen.add(k)
        if not fresh:
            if judge and observed:
                self.converged = "converged: every configuration the cost model offers was measured"
            return None
        surrogate, belief = self._surrogate(observed, sign)
        mean, sd = surrogate.predict([model.features(p) for p, _ in fresh])
        mean = mean + np.array([s for _, s in fresh])
        order = list(range(len(fresh)))
        self._rng.shuffle(order)  # ties (a prior that cannot tell them apart) in a seeded order
        fits = np.array([getattr(model, "fit_chance", lambda p: 1.0)(p) for p, _ in fresh])
        if best is None:  # the fastest prediction, weighed by its chance to fit
            i = max(order, key=lambda j: mean[j] + math.log(max(fits[j], 1e-9)))
            return fresh[i][0], "the cost model's fastest prediction (nothing measured yet)"
        bar = best[1] if belief is None else belief
        gain = expected_improvement(mean, sd, bar) * fits  # one over memory gains nothing
        i = max(order, key=lambda j: gain[j])
        if judge:
            self._judge(mean, sd, bar, len(observed), len(fresh) + len(observed), fits)
            if self.converged and self.cost_model.widen():
                self.converged = None  # judged again over the wider candidates
        learnt = getattr(model, "learnt", lambda: "")()  # EstimatorCostModel's part weights
        learnt = f"; its step parts re-weighted: {learnt}" if learnt else ""
        return fresh[i][0], (
            f"expected improvement {math.expm1(gain[i]):.1%} over the best measured (as the "
            f"model believes it, {math.exp(sign * bar):.4g}): predicted "
            f"{math.exp(sign * mean[i]):.4g}, within x/{math.exp(sd[i]):.2f} at one sd (the "
            f"cost model corrected by {surrogate.n} measured{learnt})"
            + (f"; {fits[i]:.0%} likely to fit the memory budget" if fits[i] < 0.99 else ""))

    def _surrogate(self, observed: dict, sign: float) -> tuple[Surrogate, float | None]:
        """Fitted to log(measured / prior) of each measured configuration, in the
        objective's direction; and the best measured as the model believes it: the highest
        posterior mean over the measured ones, not the highest measurement (the luckiest
        of noisy figures, a bar nothing would be likely to beat: a 4-minute CPU study
        called itself converged after 20 of 60 configurations). None: no prior known."""
        known = [(self.cost_model.features(p), score, sign * math.log(prior))
                 for p, score in observed.values() if (prior := self.cost_model.prior(p))]
        surrogate = Surrogate([f for f, _, _ in known], [s - lp for _, s, lp in known])
        if not known:
            return surrogate, None
        mean, _ = surrogate.predict([f for f, _, _ in known])
        return surrogate, float(max(mean + np.array([lp for _, _, lp in known])))

    def _judge(self, mean: np.ndarray, sd: np.ndarray, best: float, n_observed: int,
               n_candidates: int, fits: np.ndarray) -> None:
        """Converged: no candidate PROB_STOP likely to beat the best by more than the
        noise (and to fit the memory budget), and fewer than EXPECTED_STOP expected to."""
        p = prob_above(mean, sd, best + math.log1p(self.noise)) * fits
        self.converged = None
        if n_observed >= MIN_OBSERVED and p.max() < PROB_STOP and p.sum() < EXPECTED_STOP:
            self.converged = (f"converged: of {n_candidates} configurations the model ranks, "
                              f"none is {PROB_STOP:.0%} likely to beat the best by more than "
                              f"{self.noise:.0%} (at most {p.max():.1%}; "
                              f"{p.sum():.2f} expected in all)")
