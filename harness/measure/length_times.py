"""A sequence-length curriculum's step time at each length, measured, and the time of a
run to the target from them.

A curriculum's steps are not alike: a step at length 16 costs less than one at 64. The
trial's measured window sits at the start of the schedule, so its median step time is
that of the shortest sequences; steps to target x that time would under-count every
later, longer step. Instead, after the window, a few lengths of the schedule are timed
(the first, the full and evenly spaced ones between: at most MAX_LENGTHS), each over
its own short window, and a run's time to the target is the sum over its steps of the
step time at that step's length, interpolated linearly in the length between the
measured ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

MAX_LENGTHS = 5
WARMUP_STEPS = 2  # each length's first steps (a new shape: allocator, kernels' choice)


def lengths_to_time(schedule: Any) -> list[int]:
    """The schedule's distinct lengths from its first step to its full length, thinned to
    at most MAX_LENGTHS evenly spaced ones (first and full kept)."""
    steps = -(-schedule.settings.samples // schedule.batch)
    seen = sorted({schedule.length(i) for i in range(steps + 1)} | {schedule.full})
    if len(seen) <= MAX_LENGTHS:
        return seen
    picks = {int(k * (len(seen) - 1) / (MAX_LENGTHS - 1) + 0.5) for k in range(MAX_LENGTHS)}
    return [seen[i] for i in sorted(picks)]


def time_lengths(setup: Any, batches: list[Any], loss: Callable, device: torch.device,
                 lengths: list[int], steps: int) -> dict[int, float]:
    """{length: median step seconds} over `steps` steps at each length, after WARMUP_STEPS,
    each length one window of training_harness.measure.timing.WindowTimer (the device synchronised
    at both ends). The steps train on `batches` in turn (already on the device: no data
    loading inside the timing); the schedule's own lengths are restored afterwards."""
    from training_harness.measure.timing import WindowTimer
    from training_harness.strategies.curriculum import truncate

    schedule_transform = setup.batch_transform
    out: dict[int, float] = {}
    i = 0
    try:
        for n in lengths:
            setup.batch_transform = lambda _step, batch, n=n: truncate(batch, n)
            for _ in range(WARMUP_STEPS):
                setup.step(batches[i % len(batches)], loss)
                i += 1
            timer = WindowTimer(device)
            timer.start()
            for _ in range(steps):
                setup.step(batches[i % len(batches)], loss)
                i += 1
                timer.step_done()
            timer.finish()
            out[n] = statistics.median(timer.times_s)
    finally:
        setup.batch_transform = schedule_transform
    return out


def step_time_at(times: dict[int, float], length: int) -> float:
    """The step time at `length`, linear between the two nearest measured lengths (the
    nearest one's outside them)."""
    known = sorted((int(k), float(v)) for k, v in times.items())
    if length <= known[0][0]:
        return known[0][1]
    for (a, ta), (b, tb) in zip(known, known[1:], strict=False):
        if length <= b:
            return ta + (tb - ta) * (length - a) / (b - a)
    return known[-1][1]


def run_seconds(times: dict[int, float], length_of: Callable[[int], int], steps: int) -> float:
    """The seconds of `steps` steps, step i at length `length_of(i)`."""
    memo: dict[int, float] = {}
    total = 0.0
    for i in range(steps):
        n = length_of(i)
        if n not in memo:
            memo[n] = step_time_at(times, n)
        total += memo[n]
    return total


def schedule_of(plan: dict[str, Any], times: dict[int, float]) -> Any:
    """The curriculum's schedule of a plan written out in full (a record's "plan"); the
    full length is the longest measured one."""
    from training_harness.strategies.curriculum import CurriculumSettings, Schedule

    settings = CurriculumSettings(**(plan.get("strategies") or {})["curriculum"])
    batch = plan.get("global_batch_size") or plan.get("micro_batch_size")
    return Schedule(settings, max(int(k) for k in times), int(batch))
