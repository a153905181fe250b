"""The search's first guesses: the configurations the estimator ranks fastest.

The estimator's step time separates configurations by what it models (precision,
checkpointing, layout, batch) and ties those it does not (the fused kernels on a CPU,
a micro-batch that changes only overheads): on the quickstart space its fastest
prediction is shared by 15 of 60 configurations, the measured best among them. So
after the references a study queues its TIER: every sampled configuration predicted
within TIE of the fastest, in a seeded random order (the estimator cannot rank
them, a measurement must), at least START of the fastest and at most CAP (and half
of a small space), so TPE still has budget to correct a wrong estimate.

(Its effect, replayed: docs/benchmarks/search_replay_*.)

Candidates are up to `sample_size` configurations (64 for a study under half an hour,
one more per 30 s of budget, at most 1,024: all of a smaller space; a seeded sample
of a larger one, drawn without listing it: harness.study.space_sampling, so a space of
any size, ranges included, starts the same way) that the estimator predicts to fit the
memory budget. Each prediction is one request to the torch-side helper, so SAMPLE
bounds the cost. `describe_start` says in a line how a study starts (`--check`).
"""

from __future__ import annotations

import random
from typing import Any

from harness.study.study_file import Study
from harness.tune.checked_study import CheckedStudy
from harness.tune.search.correction import Correction
from harness.tune.search.estimator_model import (
    SAMPLE,
    Predictions,
    first_guess_pool,
    sample_size,
)
from harness.tune.search.sampling import startup_trials

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
    size = ready.space.size()
    return first_tier(scored, size if size is not None else 2 * CAP, ready.study.seed)


def describe_start(study: Study, size: int | None, n_references: int) -> str:
    """How a study of `size` configurations starts, in a line (`harness tune --check`)."""
    refs = f"{n_references} reference(s)"
    if study.sampler == "grid":
        return f"{refs}, then every configuration in a seeded order (grid)"
    if study.sampler == "random":
        return f"{refs}, then random proposals"
    if study.sampler == "nsga2" or (study.sampler == "auto" and len(study.objectives) > 1):
        return f"{refs}, then NSGA-II (several objectives)"
    n = sample_size(study.budget.time_s)
    among = (f"all {size:,} configurations" if size is not None and size <= n
             else f"a sample of {n} of {size:,} configurations, 8 more each trial"
             if size is not None else f"a sample of {n} configurations (some settings "
             "are ranges), 8 more each trial")
    if study.objectives == ["throughput"]:
        return (f"{refs}, then the GuidedSampler over {among}: the estimator's fastest "
                "first, then the highest expected improvement of the estimator corrected "
                "by the measured trials, with its uncertainty (one trial in five TPE's); a "
                "trial over the memory budget runs again one micro-batch smaller (or "
                "checkpointed)")
    guesses = max(START, min(CAP, (size if size is not None else 2 * CAP) // 2))
    return (f"{refs}, then up to {guesses} of the estimator's fastest predictions among "
            f"{among}, then TPE ({startup_trials(size)} random start-up trials)")


def candidates(configs: list[dict[str, Any]], seed: int | None) -> list[dict[str, Any]]:
    # The replay of recorded tables (tests/benchmarks/search_replay.py) draws its own.
    """All of `configs`, or a seeded sample of SAMPLE of them."""
    if len(configs) <= SAMPLE:
        return configs
    return random.Random(seed).sample(configs, SAMPLE)


def first_tier(scored: list[tuple[float, dict[str, Any]]], size: int,
               seed: int | None) -> list[dict[str, Any]]:
    """From (predicted samples/s, params): the fastest START, then the rest of those
    within TIE of the fastest, in a seeded random order, at most max(START, min(CAP,
    size // 2)) in all."""
    if not scored:
        return []
    ranked = sorted(scored, key=lambda sp: -sp[0])
    top = ranked[0][0]
    tier = [p for rate, p in ranked if rate >= top * (1 - TIE)]
    random.Random(seed).shuffle(tier)
    rest = [p for _, p in ranked if p not in tier]
    limit = max(START, min(CAP, size // 2))
    return (tier + rest[:max(0, START - len(tier))])[:limit]
