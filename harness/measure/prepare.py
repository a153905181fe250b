"""Checking a plan once, and the ranks' side of it: a prepared plan back in torch's terms.

    prepare(plan)            everything that can refuse a plan, before anything runs
                             (HarnessError); the estimate, the FLOPs and the peak
    prepared.checked()       the same as plain data (harness.core.prepared), which
                             the launcher writes beside plan.toml
    from_prepared(p, rank)   in each rank: the workload and device again, without
                             estimating, counting FLOPs or looking up peaks again

`harness bench` and the tuner's torch-side helper (harness.measure.probe_server)
call `prepare`; the ranks call `from_prepared`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.device import RuntimeEnv, resolve_device
from harness.core.plan import Plan
from harness.core.prepared import PreparedPlan
from harness.estimator import estimate
from harness.measure.env import capture_env
from harness.measure.peak_choice import PeakChoice, peaks_for
from harness.measure.peaks import autocast_dtype_name
from harness.workloads import Workload, load_workload
from strategies import resolved, validate


@dataclass
class Prepared:
    """A plan checked against this machine, with its workload and prediction."""

    plan: Plan
    workload: Workload
    device: torch.device
    runtime: RuntimeEnv
    predicted: dict[str, Any] | None
    peak: PeakChoice
    flops_per_sample: float
    tokens_per_sample: int | None
    notes: list[str] = field(default_factory=list)

    def checked(self, env: dict[str, Any] | None = None) -> PreparedPlan:
        """As plain data for prepared.json; `env` is captured here unless given."""
        return PreparedPlan(
            plan=self.plan, predicted=self.predicted, flops_per_sample=self.flops_per_sample,
            tokens_per_sample=self.tokens_per_sample, peak=self.peak.as_record(),
            device_type=self.device.type, device_name=self.runtime.device_name,
            env=env if env is not None else capture_env(self.device))


def prepare(plan: Plan, local_rank: int = 0) -> Prepared:
    """Everything that can refuse a plan, before anything runs (HarnessError).

    `local_rank` picks this rank's device on a node with several."""
    device = resolve_device(plan.device, local_rank)
    runtime = RuntimeEnv.detect(device.type)
    workload = load_workload(plan.workload, plan.workload_args)
    validate(plan, runtime)
    plan = resolved(plan)
    peak = peaks_for(device, runtime.device_name, autocast_dtype_name(plan.strategies))
    flops = float(workload.flops_per_sample())  # counted once: a traced count takes seconds
    predicted = estimate(plan, workload, runtime, peak.used.flops, flops).to_record()
    return Prepared(plan, workload, device, runtime, predicted, peak, flops,
                    workload.tokens_per_sample)


def from_prepared(prepared: PreparedPlan, local_rank: int = 0) -> Prepared:
    """In a rank: the prepared plan with this rank's device, its workload built again."""
    device = resolve_device(prepared.plan.device, local_rank)
    runtime = RuntimeEnv.detect(device.type)
    workload = load_workload(prepared.plan.workload, prepared.plan.workload_args)
    return Prepared(prepared.plan, workload, device, runtime, prepared.predicted,
                    PeakChoice.from_record(prepared.peak), prepared.flops_per_sample,
                    prepared.tokens_per_sample)

