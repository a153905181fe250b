"""The estimator's step time with its parts re-weighted by what the study measured.

A machine that breaks one of the estimator's assumptions (a PCIe node whose links are 15x
slower than the datasheet's NVLink) moves every configuration in proportion to one part
of its step (training_harness.estimator.result.STEP_PARTS), which one weight per part learns from a
few trials and a correction per plan feature (the surrogate) only from many:

    measured step ~ smax(k_compute compute + k_recompute recompute + k_bubble bubble,
                        k_launches launches) + k_data data + k_tensor tensor
                    + k_optimizer optimizer

where smax is the estimator's max, smoothed (SHARP); log k_compute ~ N(0, COMPUTE_SD^2)
and every other log k ~ N(log k_compute, PART_SD^2): a part no trial exercises moves with
the compute (the machine's common ratio). The prior is tight because the parts also soak
up what they do not cause: on the family's 1-GPU surfaces a GEMM efficiency that varies
with the micro-batch, read as launch cost under PART_SD 1.2, cost the search a third more
trials (docs/benchmarks/search_replay_family_2026-11-26.md). The fit is a maximum a
posteriori estimate by damped Gauss-Newton on the log step times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

PARTS = ("compute", "recompute", "bubble", "launches", "data", "tensor", "optimizer")
COMPUTE_SD = 1.5  # log units: the compute's, the common ratio of the machine
PART_SD = 0.7  # a part's own error: 2x at one sd, 4x at two (a link 15x slower is 3.9 sd)
NOISE_SD = 0.15  # what no re-weighting explains (the plan features' share, the noise)
ITERATIONS = 30
# The max of the busy time and the launches, smoothed: a part below the other still has a
# slope, so the fit can learn that the launches, not the compute, bind on this machine
# (under a hard max, a part the estimator puts below the other never moves).
SHARP = 4.0


def _step(x: Any, k: Any) -> Any:
    """The step of parts `x` (one plan's floats, or a column per part) weighted by `k`."""
    busy, launches = x[0] * k[0] + x[1] * k[1] + x[2] * k[2], x[3] * k[3]
    return (busy**SHARP + launches**SHARP) ** (1 / SHARP) + x[4] * k[4] + x[5] * k[5] \
        + x[6] * k[6]


def _log_steps(theta: np.ndarray, columns: np.ndarray) -> np.ndarray:
    return np.log(_step(columns, np.exp(theta)))


def _prior() -> np.ndarray:
    """A with theta' A theta the prior's term: compute around 0, the rest around it."""
    n = len(PARTS)
    a = np.zeros((n, n))
    a[0, 0] = COMPUTE_SD**-2
    for i in range(1, n):
        d = np.zeros(n)
        d[i], d[0] = 1.0, -1.0
        a += np.outer(d, d) / PART_SD**2
    return a


class PartFit:
    """Fitted to `rows` of predicted step parts (seconds) and the `measured` step seconds
    of each."""

    def __init__(self, rows: Sequence[dict[str, float]], measured: Sequence[float]):
        keep = [i for i, (r, m) in enumerate(zip(rows, measured, strict=True))
                if m > 0 and sum(float(r.get(p) or 0.0) for p in PARTS) > 0]
        self.n = len(keep)
        self.theta = np.zeros(len(PARTS))
        if self.n:
            x = np.array([[float(rows[i].get(p) or 0.0) for i in keep] for p in PARTS])
            y = np.log(np.array([measured[i] for i in keep], dtype=float))
            self.theta = self._fit(x, y)
        self._k = [math.exp(t) for t in self.theta]

    @staticmethod
    def _fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        prior = _prior()
        theta = np.zeros(len(PARTS))
        damping = 1e-3

        def loss(t: np.ndarray) -> float:
            r = _log_steps(t, x) - y
            return float((r**2).sum() / NOISE_SD**2 + t @ prior @ t)

        now = loss(theta)
        for _ in range(ITERATIONS):
            base = _log_steps(theta, x)
            r = base - y
            jac = np.column_stack([(_log_steps(theta + h, x) - base) / 1e-5  # numerical
                                   for h in 1e-5 * np.eye(len(theta))])
            grad = jac.T @ r / NOISE_SD**2 + prior @ theta
            hess = jac.T @ jac / NOISE_SD**2 + prior
            while True:
                trial = theta - np.linalg.solve(hess + damping * np.diag(np.diag(hess)), grad)
                after = loss(trial)
                if after <= now:
                    theta, now, damping = trial, after, max(damping / 10, 1e-9)
                    break
                damping *= 10
                if damping > 1e6:
                    return theta
            if np.abs(grad).max() < 1e-8:
                break
        return theta

    def weights(self) -> dict[str, float]:
        """Each part's multiplier."""
        return {p: math.exp(t) for p, t in zip(PARTS, self.theta, strict=True)}

    def ratio(self, parts: dict[str, float]) -> float:
        """Corrected over predicted step time for a plan of these parts (1.0 without
        parts). Plain floats: the sampler asks it of thousands of candidates each trial."""
        x = [float(parts.get(p) or 0.0) for p in PARTS]
        predicted = _step(x, [1.0] * len(PARTS))
        return _step(x, self._k) / predicted if predicted > 0 else 1.0
