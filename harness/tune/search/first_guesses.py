"""The estimator's first guesses for plain TPE (a time-to-loss or two-objective study; the
GuidedSampler starts from the estimator itself).

The estimator ties configurations that differ only in what it does not model (fused
kernels on a CPU, a micro-batch that changes only overheads: 15 of the quickstart's 60
share its fastest prediction), so the start is its TIER: every sampled configuration
within TIE of the fastest, in a seeded order (a measurement must rank them), at least
START and at most CAP (half of a small space), so that TPE keeps budget to correct a
wrong estimate. Replayed: docs/benchmarks/search_replay_*.
"""

from __future__ import annotations

import random
from typing import Any

from training_harness.tune.checked_study import CheckedStudy
from training_harness.tune.model.correction import Correction
from training_harness.tune.model.estimator_model import Predictions, first_guess_pool, sample_size

START = 5
CAP = 16
TIE = 0.05  # predictions this close to the fastest are the estimator's tie


def estimated_start(ready: CheckedStudy, taken: list[dict[str, Any]],
                    predictions: Predictions) -> list[dict[str, Any]]:
    """The configurations to measure first, as parameters (none of `taken`)."""
    n = sample_size(ready.study.budget.time_s)
    configs = [p for p in first_guess_pool(ready.space, ready.study.seed, n)
               if p not in taken][:n]
    fresh = Correction.from_records([], ready.device_type)  # the defaults: nothing measured
    scored = [(rate, params) for params in configs
              if (rate := predictions.rate(params, fresh, ready.budget_bytes)) > 0]
    return first_tier(scored, ready.space.size(), ready.study.seed)


def tier_limit(size: int | None) -> int:
    """The most first guesses for a space of `size` configurations (None: unbounded)."""
    return max(START, min(CAP, (size if size is not None else 2 * CAP) // 2))


def first_tier(scored: list[tuple[float, dict[str, Any]]], size: int | None,
               seed: int | None) -> list[dict[str, Any]]:
    """From (predicted samples/s, params): the fastest START, then the rest of those
    within TIE of the fastest, in a seeded random order, at most tier_limit(size)."""
    if not scored:
        return []
    ranked = sorted(scored, key=lambda sp: -sp[0])
    top = ranked[0][0]
    tier = [p for rate, p in ranked if rate >= top * (1 - TIE)]
    random.Random(seed).shuffle(tier)
    rest = [p for _, p in ranked if p not in tier]
    return (tier + rest[:max(0, START - len(tier))])[:tier_limit(size)]
