"""One trial: build the workload, compose the strategies, train, measure, record.

The loop reads like nanoGPT's bench.py: warm-up steps, then measured steps that
each end in a device synchronisation; median step time and MFU from those.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import torch

from harness.batches import step_pool
from harness.device import RuntimeEnv, resolve_device, synchronize
from harness.env import capture_env
from harness.errors import HarnessError
from harness.estimator import estimate
from harness.memory import MemoryTracker, peak_memory_bytes
from harness.nvml import NvmlSampler
from harness.peaks import autocast_dtype_name, peaks_for
from harness.plan import Plan
from harness.result import TrialResult, empty_metrics
from harness.timing import StepTimer, summarize
from harness.workloads import Workload, load_workload
from strategies import compose, resolved, validate

@dataclass
class Prepared:
    """A plan checked against this machine, with its workload and prediction."""

    plan: Plan
    workload: Workload
    device: torch.device
    runtime: RuntimeEnv
    predicted: dict[str, Any] | None
    peak: Any  # harness.peaks.PeakChoice
    notes: list[str] = field(default_factory=list)


def prepare(plan: Plan) -> Prepared:
    """Everything that can refuse a plan, before anything runs (HarnessError)."""
    device = resolve_device(plan.device)
    runtime = RuntimeEnv.detect(device.type)
    workload = load_workload(plan.workload, plan.workload_args)
    validate(plan, runtime)
    plan = resolved(plan)
    peak = peaks_for(device, runtime.device_name, autocast_dtype_name(plan.strategies))
    predicted = estimate(plan, workload, runtime, peak.used.flops).to_record()
    return Prepared(plan, workload, device, runtime, predicted, peak)


def is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(e)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def run_trial(
    plan: Plan, command: str, study: str | None = None, trial_id: int | str | None = None
) -> TrialResult:
    """Run `plan` here and return its record. A user's mistake raises HarnessError
    before anything runs; a failure while running becomes the record's status."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    prep = prepare(plan)
    result = TrialResult(
        study=study,
        trial_id=trial_id,
        status="ok",
        reason=None,
        plan=prep.plan.to_dict(),
        predicted=prep.predicted,
        env=capture_env(prep.device),
        command=command,
        started_at=started_at,
    )
    try:
        result.metrics, result.status, result.reason = measure(prep)
    except HarnessError:
        raise
    except BaseException as e:  # a trial's failure is data, not a crash
        if isinstance(e, KeyboardInterrupt):
            raise
        result.status = "oom" if is_oom(e) else "failed"
        first_line = (str(e).strip().splitlines() or [""])[0][:500]
        what = "out of memory" if result.status == "oom" else type(e).__name__
        result.reason = f"{what}: {first_line}"
        result.metrics["traceback_tail"] = traceback.format_exc()[-4000:]
    finally:
        if prep.device.type == "cuda":
            torch.cuda.empty_cache()
    result.duration_s = time.perf_counter() - t0
    return result


def measure(prep: Prepared) -> tuple[dict[str, Any], str, str | None]:
    plan, device, workload = prep.plan, prep.device, prep.workload
    torch.manual_seed(plan.seed)
    memory = MemoryTracker(device)
    memory.begin()
    with torch.device(device):
        model = workload.build_model()
    setup = compose(model, plan, device, prep.runtime)
    pool = step_pool(plan, workload, device)
    timer = StepTimer(device)
    losses: list[float] = []
    status, reason = "ok", None

    def record(loss: torch.Tensor, step: int) -> bool:
        losses.append(loss.item())  # outside the timed region
        if not math.isfinite(losses[-1]):
            nonlocal status, reason
            status, reason = "diverged", f"loss became {losses[-1]} at step {step}"
            return False
        return True

    for i in range(plan.warmup_steps):
        if not record(setup.step(pool[i % len(pool)], workload.loss), i):
            break
    synchronize(device)
    with NvmlSampler(device) as nvml:
        for i in range(plan.warmup_steps, plan.warmup_steps + plan.steps):
            if status != "ok":
                break
            with timer.step():
                loss = setup.step(pool[i % len(pool)], workload.loss)
            record(loss, i)
    mem = memory.end()
    reading = nvml.reading()

    metrics = empty_metrics()
    metrics["loss"] = {
        "first": losses[0] if losses else None,
        "last": losses[-1] if losses else None,
        "finite": all(math.isfinite(v) for v in losses) if losses else None,
        "values": losses,
        "warmup_steps": min(plan.warmup_steps, len(losses)),
    }
    metrics["memory"] = {**mem, "nvml_used": reading.memory_used_peak_bytes if reading else None}
    metrics["peak_memory_bytes"] = peak_memory_bytes(mem)
    metrics["notes"] = setup.notes
    if not timer.times_s:
        return metrics, status, reason or "no measured step completed"

    times = summarize(timer.times_s)
    median = times["median"]
    flops_per_step = workload.flops_per_sample() * plan.batch_size
    tflops = flops_per_step / median / plan.world_size / 1e12
    peak = prep.peak
    samples_per_s = plan.batch_size / median
    metrics.update(
        step_time_s=times,
        step_times_s=timer.times_s,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * workload.tokens_per_sample if workload.tokens_per_sample else None,
        flops_per_step=flops_per_step,
        tflops_per_device=tflops,
        mfu=tflops * 1e12 / peak.used.flops,
        mfu_measured_peak=tflops * 1e12 / peak.measured.flops,
        peak_flops_source=peak.used.source,
        peak_flops=peak.as_record(),
        energy_j_per_sample=(
            reading.energy_j / (len(timer.times_s) * plan.batch_size)
            if reading and reading.energy_j is not None
            else None
        ),
        nvml=dataclasses.asdict(reading) if reading else None,
    )
    return metrics, status, reason
