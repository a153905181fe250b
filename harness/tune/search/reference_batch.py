"""The references' micro-batch: the largest that is predicted to fit the memory budget.

The fp32 baseline (and a known-good configuration that names no micro-batch) runs
at the largest micro-batch, the least accumulation. On a GPU that is often more
than fp32 activations fit in (GPT-2 small at 64 x 1024 tokens wants ~110 GiB), and
a baseline refused for memory leaves the study with nothing to compare against.
So each is moved down to the largest micro-batch whose prediction, corrected as
before any trial (harness.tune.search.correction), is within the budget.
"""

from __future__ import annotations

from typing import Any

from harness.core.errors import HarnessError
from harness.study.machine_facts import MachineFacts
from harness.study.search_space import SearchSpace
from harness.tune.search.correction import Correction


def largest_fitting_micro(
    space: SearchSpace, params: dict[str, Any], probe: Any, facts: MachineFacts,
    budget_bytes: float,
) -> dict[str, Any]:
    """`params` with its micro-batch lowered until the predicted peak fits; unchanged
    where it already fits, where no smaller size fits either, or where the plan is
    refused (the trial then records why)."""
    name = next((k for k in params if k.startswith("micro_batch_size")), None)
    if name is None:
        return params
    correction = Correction.from_records([], facts.device_type)
    sizes = [m for m in space.micros_for(space.plan(params).layout) if m <= params[name]]
    for micro in sorted(sizes, reverse=True):
        candidate = {**params, name: micro}
        try:
            prepared = probe.prepare(space.plan(candidate), facts.peaks)
        except HarnessError:
            return params
        peak = correction.peak_memory(prepared.predicted)
        if peak is None or peak <= budget_bytes:
            return candidate
    return params
