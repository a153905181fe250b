"""Checking a plan once, and the ranks' side of it: a prepared plan back in torch's terms.

    prepare(plan)            everything that can refuse a plan, before anything runs
                             (HarnessError); the estimate, the FLOPs and the peak
    prepared.checked()       the same as plain data (training_harness.core.prepared), which
                             the launcher writes beside plan.toml
    from_prepared(p, rank)   in each rank: the workload and device again, without
                             estimating, counting FLOPs or looking up peaks again

`harness bench` and the tuner's torch-side helper (training_harness.measure.torch_helper_server)
call `prepare`; the ranks call `from_prepared`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from training_harness.core.device import RuntimeEnv, resolve_device
from training_harness.core.plan import Plan
from training_harness.core.prepared import PreparedPlan
from training_harness.estimator import estimate
from training_harness.estimator.profiled_step import DeviceProfile
from training_harness.measure.device_overhead import device_overhead
from training_harness.measure.device_profile import cached_profile
from training_harness.measure.env import capture_env
from training_harness.measure.peaks import (
    PeakChoice,
    autocast_dtype_name,
    matmul_dtype,
    measured_peaks,
    peaks_for,
)
from training_harness.strategies.compose import resolved, validate
from training_harness.workloads import Workload, load_workload


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


def prepare(
    plan: Plan, local_rank: int = 0, peaks: dict[str, dict[str, Any]] | None = None,
    phases: dict[str, float] | None = None,
) -> Prepared:
    """Everything that can refuse a plan, before anything runs (HarnessError).

    `local_rank` picks this rank's device on a node with several. `peaks`: a study's
    fixed peaks (PeakChoice records by compute dtype, see `study_peaks`); a dtype
    not among them is looked up (and, on a cache miss, calibrated) here. `phases`,
    if given, gets the seconds of each step: `check` (device, workload, the plan
    against the registry), `peaks`, `flops`, `estimate`."""
    lap = _Laps(phases)
    device = resolve_device(plan.device, local_rank)
    runtime = RuntimeEnv.detect(device.type)
    workload = load_workload(plan.workload, plan.workload_args)
    validate(plan, runtime)
    plan = resolved(plan)
    lap("check")
    dtype = autocast_dtype_name(plan.strategies)
    if peaks and dtype in peaks:
        peak = PeakChoice.from_record(peaks[dtype])
    else:
        peak = peak_for_workload(device, runtime.device_name, dtype, workload)
    lap("peaks")
    flops = flops_per_sample(plan, workload)
    lap("flops")
    overhead = device_overhead(device) if device.type == "cuda" else None
    measured = cached_profile(device, runtime.device_name)  # `harness calibrate` measures it
    predicted = estimate(plan, workload, runtime, peak.used.flops, flops, overhead,
                         workload_key=_workload_key(plan),
                         profile=DeviceProfile(measured) if measured else None).to_record()
    lap("estimate")
    return Prepared(plan, workload, device, runtime, predicted, peak, flops,
                    workload.tokens_per_sample)


class _Laps:
    """Seconds since the last lap, into `phases` (when there is one) under each name."""

    def __init__(self, phases: dict[str, float] | None) -> None:
        self.phases, self.t = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        if self.phases is not None:
            self.phases[name] = now - self.t
        self.t = now


_FLOPS: dict[str, float] = {}  # this process's counts, by workload and its arguments


def flops_per_sample(plan: Plan, workload: Workload) -> float:
    """The model FLOPs of one sample, counted once per workload and arguments in this
    process: the tuner's helper prepares every trial of a study, and a traced count
    (FlopCounterMode, for models without a formula) takes seconds to tens of seconds.
    The strategies leave them unchanged (MFU counts the model's FLOPs, not the work a
    technique adds), so only the workload and its arguments key them."""
    key = _workload_key(plan)
    if key not in _FLOPS:
        _FLOPS[key] = float(workload.flops_per_sample())
    return _FLOPS[key]


def _workload_key(plan: Plan) -> str:
    """What load_workload built the plan's workload from: in this process, one model."""
    return json.dumps([plan.workload, plan.workload_args], sort_keys=True, default=str)


def peak_for_workload(
    device: torch.device, device_name: str, dtype: str, workload: Workload,
    convolutions: bool | None = None,
) -> PeakChoice:
    """The peaks of `dtype` for this workload; only fp32 on CUDA needs the model (its
    convolutions run on TF32 tensor cores where cuDNN allows, its matmuls may not).
    `convolutions`, where the caller has looked already."""
    if convolutions is None:
        convolutions = device.type == "cuda" and dtype == "fp32" and has_convolutions(workload)
    return peaks_for(device, device_name, dtype, convolutions=convolutions)


def has_convolutions(workload: Workload) -> bool:
    """Whether the workload's model has convolutions (built on the meta device)."""
    with torch.device("meta"):
        model = workload.build_model()
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def study_peaks(
    device_type: str, dtypes: list[str], workload: Workload
) -> dict[str, dict[str, Any]]:
    """A study's fixed MFU denominators, one PeakChoice record per compute dtype, taken
    once at its start so every trial of the study divides by the same figure."""
    device = resolve_device(device_type)
    name = RuntimeEnv.detect(device.type).device_name
    conv = device.type == "cuda" and "fp32" in dtypes and has_convolutions(workload)
    # the figures not cached yet, measured together (one calibration process on a GPU)
    measured_peaks(device, [matmul_dtype(device, d, conv) for d in dtypes])
    return {d: {**peak_for_workload(device, name, d, workload, conv).as_record(),
                "compute_dtype": d} for d in dtypes}


def from_prepared(prepared: PreparedPlan, local_rank: int = 0) -> Prepared:
    """In a rank: the prepared plan with this rank's device, its workload built again."""
    device = resolve_device(prepared.plan.device, local_rank)
    runtime = RuntimeEnv.detect(device.type)
    workload = load_workload(prepared.plan.workload, prepared.plan.workload_args)
    return Prepared(prepared.plan, workload, device, runtime, prepared.predicted,
                    PeakChoice.from_record(prepared.peak), prepared.flops_per_sample,
                    prepared.tokens_per_sample)

