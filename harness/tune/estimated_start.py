"""The search's first guesses: the configurations the estimator ranks fastest.

Replayed on a recorded table of the quickstart space (tests/benchmarks/search_replay.py),
TPE's random start-up needed about as much measuring as random search to find a
configuration within 0.97 of the best, while the estimator's order needed a third of
it; queuing its five fastest guesses first halved the tuner's median cost and its 90th
percentile there (three guesses: a third off the median, none off the 90th). So after
the references a study queues the START configurations with the highest
predicted throughput (global batch / predicted step time) among up to SAMPLE of its
configurations (all of a smaller space; a seeded sample of a larger one) that the
estimator predicts to fit the memory budget. Each prediction is one request to the
torch-side helper (about 0.1 s on the 2-core CPU), so SAMPLE bounds the cost.
"""

from __future__ import annotations

import random
from typing import Any

from harness.core.errors import HarnessError
from harness.tune.calibration import Calibration
from harness.tune.ready import ReadyStudy

START = 5
SAMPLE = 32
LISTABLE = 20_000  # larger spaces are not listed to sample from


def estimated_start(ready: ReadyStudy, taken: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Up to START configurations' parameters, predicted fastest first (not in `taken`)."""
    size = ready.space.size()
    if size is None or size > LISTABLE:
        return []
    configs = [p for p in ready.space.enumerate() if p not in taken]
    if len(configs) > SAMPLE:
        configs = random.Random(ready.study.seed).sample(configs, SAMPLE)
    fresh = Calibration.from_records([], ready.device_type)  # the defaults: nothing measured
    scored = []
    for params in configs:
        plan = ready.space.plan(params)
        try:
            predicted = ready.probe.prepare(plan, ready.facts.peaks).predicted or {}
        except HarnessError:
            continue  # refused here: the search records why, if it proposes it
        peak, step = fresh.peak_memory(predicted), predicted.get("step_time_s")
        if step and (peak is None or peak <= ready.budget_bytes):
            scored.append((plan.batch_size / step, params))
    scored.sort(key=lambda sp: -sp[0])
    return [params for _, params in scored[:START]]
