"""The estimator's step time corrected per factor, from the study's own measured trials.

One ratio (measured / predicted) for every configuration cannot learn that the estimator
is right about bf16 and wrong about compile, so the correction is the surrogate fitted to
log(measured step / predicted step) over the plan's `factors`: close to one ratio for all
with a few trials, each factor earning its own weight as trials that differ in it come in.
"""

from __future__ import annotations

import math
from typing import Any

from training_harness.tune.model.surrogate import Surrogate

# Every searchable setting of the registry's strategies (Strategy.space; the tuner does not
# import them, torch with them: tests/tuner/test_step_fit.py holds the two together). A
# setting missing here is invisible to the correction and to the search's model: the
# float8 recipe, checkpoint's policy (selective or full) and compile_mode were.
SETTINGS = (
    "dtype", "attention", "optimizer", "compile", "compile_mode", "layernorm", "gelu",
    "cross_entropy", "every", "policy", "stage", "offload", "schedule", "virtual_stages",
    "bucket_cap_mb", "compression", "mlp", "recipe", "rank", "alpha", "max_grad_norm",
    "momentum", "method", "decay", "start", "samples", "temperature", "weight",
    "sdpa_backend", "window_fraction", "global_tokens", "linear_cross_entropy",
    "powersgd_rank", "start_powersgd_iter")


def factors(plan: dict[str, Any]) -> dict[str, float]:
    """A plan's factors, by name: log2 of the micro-batch (a trend) and an indicator per
    size (a launch-bound small one is off the trend), log2 of each layout axis, and an
    indicator per technique and per searched setting value (amp.dtype=bf16, ...)."""
    micro = plan.get("micro_batch_size") or 1
    out = {"log2 micro-batch": math.log2(micro), f"micro-batch={micro}": 1.0}
    layout = plan.get("layout") or {}
    for axis in ("data", "tensor", "pipeline"):
        if (layout.get(axis) or 1) > 1:
            out[f"log2 {axis}"] = math.log2(layout[axis])
    for name, settings in (plan.get("strategies") or {}).items():
        if name == "accumulation":  # follows from the micro-batch size
            continue
        out[name] = 1.0
        for key in SETTINGS:
            if isinstance(settings, dict) and key in settings:
                out[f"{name}.{key}={settings[key]}"] = 1.0
    return out


class StepFit:
    """measured / predicted step time as exp(the surrogate's mean), fitted to `samples`
    of (plan, measured step seconds, predicted step seconds)."""

    def __init__(self, samples: list[tuple[dict[str, Any], float, float]]):
        self.n = len(samples)
        y = [math.log(m / p) for _, m, p in samples]
        self._model = Surrogate([factors(plan) for plan, _, _ in samples], y)
        self._common = math.exp(sum(y) / len(y)) if y else 1.0  # geometric mean

    def ratio(self, plan: dict[str, Any] | None) -> float:
        """measured / predicted for `plan` (the common ratio without a plan)."""
        if not self.n or plan is None:
            return self._common
        return math.exp(float(self._model.predict([factors(plan)])[0][0]))

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "ratio": self.ratio(None), "noise": round(self._model.noise, 4)}
