"""The estimator's step time corrected per factor, from the study's own measured trials.

One ratio (measured / predicted) for every configuration cannot learn that the
estimator is right about bf16 and wrong about compile, or right at micro-batch 64 and
wrong at 1. So the correction is a small regression over the configuration's factors:

    log(measured step / predicted step) = w0 + sum_f w_f x_f

x_f are the plan's factors (`factors`): log2 of the micro-batch size (a trend) and an
indicator per size (a launch-bound small micro-batch is not a straight line in log2),
log2 of each layout axis, and an indicator per technique and per searched setting
value (amp bf16, fused.compile True, zero.stage 3, ...). The fit is ridge regression
(RIDGE pulls each w_f towards 0, none on w0), so with a few trials it is close to one
ratio for all, and each factor earns its own weight as trials that differ in it come
in. A factor never measured has weight 0: the prediction of a configuration with a
new technique is the estimator's, scaled by what the study learnt of the rest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

RIDGE = 0.1  # in log units: pulls a factor to 0 until trials differ in it
NOT_FACTORS = {"accumulation"}  # follows from the micro-batch size
SETTINGS = ("dtype", "attention", "optimizer", "compile", "stage", "schedule", "every",
            "offload", "mode", "layernorm", "gelu", "cross_entropy")


def factors(plan: dict[str, Any]) -> dict[str, float]:
    """A plan's factors, by name."""
    out: dict[str, float] = {}
    micro = plan.get("micro_batch_size") or 1
    out["log2 micro-batch"] = math.log2(micro)  # the trend, for sizes not measured yet
    out[f"micro-batch={micro}"] = 1.0  # each size's own departure from the trend
    layout = plan.get("layout") or {}
    for axis in ("data", "tensor", "pipeline"):
        if (layout.get(axis) or 1) > 1:
            out[f"log2 {axis}"] = math.log2(layout[axis])
    for name, settings in (plan.get("strategies") or {}).items():
        if name in NOT_FACTORS:
            continue
        out[name] = 1.0
        for key in SETTINGS:
            if isinstance(settings, dict) and key in settings:
                out[f"{name}.{key}={settings[key]}"] = 1.0
    return out


class StepFit:
    """measured / predicted step time as exp(w0 + w . factors), fitted to `samples`
    of (plan, measured step seconds, predicted step seconds)."""

    def __init__(self, samples: list[tuple[dict[str, Any], float, float]]):
        self.n = len(samples)
        rows = [factors(plan) for plan, _, _ in samples]
        self.names = sorted({name for row in rows for name in row})
        self.weights: dict[str, float] = {}
        self.intercept = 0.0
        if not samples:
            return
        y = np.array([math.log(m / p) for _, m, p in samples])
        x = np.array([[row.get(n, 0.0) for n in self.names] for row in rows])
        if not self.names:
            self.intercept = float(np.mean(y))
            return
        x1 = np.hstack([np.ones((len(rows), 1)), x])
        penalty = RIDGE * np.eye(x1.shape[1])
        penalty[0, 0] = 0.0  # the common ratio is not pulled anywhere
        w = np.linalg.solve(x1.T @ x1 + penalty, x1.T @ y)
        self.intercept = float(w[0])
        self.weights = {n: float(v) for n, v in zip(self.names, w[1:], strict=True)}

    def ratio(self, plan: dict[str, Any] | None) -> float:
        """measured / predicted for `plan` (the common ratio without a plan)."""
        if plan is None:
            return math.exp(self.intercept)
        f = factors(plan)
        return math.exp(self.intercept + sum(self.weights.get(n, 0.0) * v
                                             for n, v in f.items()))

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "ratio": math.exp(self.intercept),
                "factors": {n: round(math.exp(w), 4) for n, w in self.weights.items()}}
