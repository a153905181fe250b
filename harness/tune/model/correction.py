"""The estimator, corrected by what the study has measured so far (docs/tuning.md, "Budgets").

Each measured component gets its own correction, a median over the study's ok trials:
`runtime_bytes` (what the process holds before the model is built), `memory_ratio`,
`step_ratio` (per factor of the configuration once two trials are measured: step_fit) and
`overhead_s`, a trial's duration beyond its steps, apart for compiled trials:

    corrected peak  = runtime + memory_ratio x predicted tensors
    corrected step  = predicted step x the fit's ratio for the plan (step_ratio before)
    expected trial  = overhead + (warm-up + the window's steps as the trial loop will
                      choose them: training_harness.core.window) x corrected step

(The record and study.json keep these under the older keys `calibration` and
`calibrated_peak_memory_bytes`.)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from training_harness.core.memory_need import budget_peak_bytes
from training_harness.core.window import window_rule, window_steps
from training_harness.tune.model.step_fit import StepFit

# A CPU trial forked from the rank server starts in a fraction of a second, but the first
# may wait for the server's imports (3-6 s on the 2-core CPU: docs/benchmarks/trial_overhead_*).
DEFAULT_OVERHEAD_S = {"cpu": 5.0, "cuda": 40.0}
# What a GPU holds for a trial beyond its tensors: on an H100 with CUDA 13 the
# context alone was 0.5 GiB, and a small trial held 0.75 GiB beyond the allocator's
# pool (docs/benchmarks/gpu_*); NCCL adds its buffers. Assumed until measured.
DEFAULT_RUNTIME_BYTES = {"cpu": 0.0, "cuda": 1024.0**3}
# Compiling a model, beyond a trial's other overhead, until a compiled trial is measured.
DEFAULT_COMPILE_S = {"cpu": 30.0, "cuda": 70.0}


def compiled(plan: dict[str, Any] | None) -> bool:
    """Whether a plan compiles its model (torch.compile: fused.compile)."""
    fused = ((plan or {}).get("strategies") or {}).get("fused") or {}
    return bool(fused.get("compile"))


def steps_run(record: dict[str, Any]) -> int:
    """The steps a trial ran: its warm-up (which on CUDA runs on until the step times
    settle) and its window (which lasts at least its least duration), as the record
    says; the plan's counts for a record without them."""
    m, plan = record.get("metrics") or {}, record.get("plan") or {}
    warmup = (m.get("loss") or {}).get("warmup_steps")
    window = (m.get("window") or {}).get("steps")
    if warmup is None or window is None:
        return int(plan.get("warmup_steps", 0)) + int(plan.get("steps", 0))
    return int(warmup) + int(window)


def tensor_bytes(predicted: dict[str, Any] | None) -> float | None:
    """The estimator's peak without the device's own terms (context, workspaces, NCCL:
    `device_overhead_bytes`), which the runtime correction stands for once measured."""
    if not predicted or predicted.get("peak_memory_bytes") is None:
        return None
    return float(predicted["peak_memory_bytes"]) - float(
        predicted.get("device_overhead_bytes") or 0)


@dataclass
class Correction:
    runtime_bytes: float = 0.0
    memory_ratio: float = 1.0
    step_ratio: float = 1.0
    overhead_s: float | None = None
    overhead_compiled_s: float | None = None
    n_memory: int = 0
    n_time: int = 0
    fit: StepFit = field(default_factory=lambda: StepFit([]))

    @classmethod
    def from_records(cls, records: list[dict[str, Any]], device_type: str = "cpu") -> Correction:
        runtime, mem, over, over_compiled, samples = [], [], [], [], []
        for r in records:
            if r.get("status") != "ok" or not r.get("predicted"):
                continue
            m, p = r["metrics"], r["predicted"]
            memory = m.get("memory") or {}
            on_gpu = memory.get("allocated") is not None
            base = (memory.get("device_base") or 0) if on_gpu else memory.get("rss_base")
            # what it needed: under the allocator's cap not the cache the device held
            peak, predicted_peak = budget_peak_bytes(r), tensor_bytes(p)
            if peak and predicted_peak and base is not None:
                runtime.append(base)
                mem.append(max(peak - base, 0) / predicted_peak)
            median = (m.get("step_time_s") or {}).get("median")
            if (m.get("interference") or {}).get("flagged"):
                median = None  # the time of a busy machine, not the configuration's
            plan = r.get("plan") or {}
            if median and p.get("step_time_s"):
                samples.append((plan, median, p["step_time_s"]))
            if median and r.get("duration_s"):
                beyond = max(r["duration_s"] - steps_run(r) * median, 0.0)
                (over_compiled if compiled(plan) else over).append(beyond)
        med = statistics.median
        step = [measured / predicted for _, measured, predicted in samples]
        return cls(
            runtime_bytes=med(runtime) if runtime else DEFAULT_RUNTIME_BYTES.get(device_type, 0.0),
            memory_ratio=med(mem) if mem else 1.0,
            step_ratio=med(step) if step else 1.0,
            overhead_s=med(over) if over else None,
            overhead_compiled_s=med(over_compiled) if over_compiled else None,
            n_memory=len(mem), n_time=len(step), fit=StepFit(samples))

    def peak_memory(self, predicted: dict[str, Any] | None) -> float | None:
        tensors = tensor_bytes(predicted)
        if tensors is None:
            return None
        runtime = self.runtime_bytes
        if not self.n_memory and (predicted or {}).get("device_overhead_bytes"):
            runtime = float(predicted["device_overhead_bytes"])  # measured on this GPU
        return runtime + self.memory_ratio * tensors

    def step_time(self, predicted: dict[str, Any] | None,
                  plan: dict[str, Any] | None = None) -> float | None:
        """The corrected step time of `plan` (its factors' fit once two trials are
        measured; the common ratio before, or without a plan)."""
        if not predicted or predicted.get("step_time_s") is None:
            return None
        if plan is not None and self.fit.n >= 2:
            return self.fit.ratio(plan) * predicted["step_time_s"]
        return self.step_ratio * predicted["step_time_s"]

    def start_seconds(self, device_type: str, plan: dict[str, Any] | None = None) -> float:
        """A trial's expected time beyond its steps (starting, building, compiling)."""
        default = DEFAULT_OVERHEAD_S.get(device_type, DEFAULT_OVERHEAD_S["cuda"])
        overhead = self.overhead_s if self.overhead_s is not None else default
        if compiled(plan):
            overhead = self.overhead_compiled_s if self.overhead_compiled_s is not None else (
                overhead + DEFAULT_COMPILE_S.get(device_type, DEFAULT_COMPILE_S["cuda"]))
        return overhead

    def trial_seconds(self, predicted: dict[str, Any] | None, steps: int,
                      device_type: str, plan: dict[str, Any] | None = None) -> float:
        """How long a trial is expected to take, start to record."""
        overhead = self.start_seconds(device_type, plan)
        step = self.step_time(predicted, plan) or 0.0
        if plan is not None:  # a window padded to its least duration (2 s on CUDA)
            warmup = int(plan.get("warmup_steps") or 0)
            _, min_s = window_rule(warmup, steps - warmup, plan.get("warmup_max_steps"),
                                   plan.get("min_window_s"), device_type)
            steps = warmup + window_steps(steps - warmup, min_s, step)
        return overhead + steps * step

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fit"] = self.fit.as_dict()
        return out


class Corrections:
    """The correction from a run folder's records so far, fitted again only when a record
    came or went (the search asks for it several times per trial)."""

    def __init__(self, records: Callable[[], list[dict[str, Any]]], device_type: str):
        self.records, self.device_type = records, device_type
        self._fitted: tuple[Any, Correction] | None = None

    def __call__(self) -> Correction:
        records = self.records()
        stamp = (len(records), records[-1].get("trial_id") if records else None)
        if self._fitted is None or self._fitted[0] != stamp:
            self._fitted = (stamp, Correction.from_records(records, self.device_type))
        return self._fitted[1]
