"""How long a trial's warm-up and measured window last (torch-free: the trial loop
follows it, training_harness.measure.timing; the tuner's cost model predicts trials by it)."""

from __future__ import annotations

import math

CUDA_WARMUP_MAX_STEPS = 50  # warm-up's cap on CUDA
CUDA_MIN_WINDOW_S = 2.0  # the measured window's least duration on CUDA
MAX_WINDOW_STEPS = 100_000  # the most steps a window grows to for its duration


def window_rule(warmup_steps: int, steps: int, warmup_max_steps: int | None,
                min_window_s: float | None, device_type: str) -> tuple[int, float]:
    """(warm-up's cap, the window's least seconds) for a plan: its own settings, else
    50 steps and 2 s on CUDA, and on other devices no more warm-up than `warmup_steps`
    and no least duration (CPU studies keep their speed)."""
    cuda = device_type == "cuda"
    cap = warmup_max_steps if warmup_max_steps is not None else (
        CUDA_WARMUP_MAX_STEPS if cuda else warmup_steps)
    min_s = min_window_s if min_window_s is not None else (CUDA_MIN_WINDOW_S if cuda else 0.0)
    return max(cap, warmup_steps), float(min_s)


def window_steps(steps: int, min_window_s: float, step_s: float | None) -> int:
    """The measured window's steps: `steps`, or as many as last `min_window_s` at `step_s`
    each (10% more, as warm-up steps were each synchronised), whichever is more."""
    if not min_window_s or not step_s or step_s <= 0:
        return steps
    return max(steps, min(MAX_WINDOW_STEPS, math.ceil(1.1 * min_window_s / step_s)))
