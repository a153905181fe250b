"""One trial: build the workload, compose the strategies, train, measure, record.

The loop reads like nanoGPT's bench.py: warm-up steps, then measured steps that
each end in a device synchronisation; median step time and MFU from those.

The same code runs in every rank of a distributed trial (harness.measure.rank_main): each
rank trains its share, the ranks agree on the loss of every step, and their
figures are combined into the job's (harness.measure.ranks).
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from datetime import UTC, datetime
from typing import Any

import torch

from harness.core.device import synchronize
from harness.core.errors import HarnessError
from harness.measure import distributed
from harness.measure.batches import step_pool
from harness.measure.env import capture_env
from harness.measure.memory import MemoryTracker
from harness.measure.nvml import NvmlSampler
from harness.measure.peak_calibration import forget_measured_peak
from harness.measure.prepare import Prepared
from harness.measure.rank_process import RankInfo
from harness.measure.ranks import combine, rank_figures, step_loss
from harness.measure.step_log import step_writer
from harness.measure.timing import StepTimer, step_time_stats
from harness.records.result import TrialResult, empty_metrics
from strategies import compose


def is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(e)
    return "out of memory" in text.lower() or "can't allocate memory" in text


def run_trial(
    prep: Prepared,
    command: str,
    study: str | None = None,
    trial_id: int | str | None = None,
    rank: RankInfo | None = None,
) -> TrialResult:
    """Run the prepared plan here and return its record. A user's mistake raises HarnessError
    before anything runs; a failure while running becomes the record's status.

    `rank` is this process's place in a distributed trial (default: the only one).
    There a failure is raised, not recorded: the other ranks may be waiting for
    this one in a collective, so the process must end (and torchrun stop the rest);
    the launcher makes the record from the ranks' error files.
    """
    info = rank or RankInfo()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
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
        result.metrics, result.status, result.reason = measure(prep, info)
    except HarnessError:
        raise
    except BaseException as e:  # a trial's failure is data, not a crash
        if isinstance(e, KeyboardInterrupt) or info.distributed:
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


def measure(
    prep: Prepared, info: RankInfo | None = None
) -> tuple[dict[str, Any], str, str | None]:
    info = info or RankInfo()
    plan, device, workload = prep.plan, prep.device, prep.workload
    torch.manual_seed(plan.seed)
    memory = MemoryTracker(device)
    memory.begin()
    with torch.device(device):
        model = workload.build_model()
    setup = compose(model, plan, device, prep.runtime)
    pool = step_pool(plan, workload, device, data_rank=plan.layout.coordinates(info.rank)[1])
    # Each timed step starts after a barrier, so the slowest rank sets its time.
    timer = StepTimer(device, barrier=distributed.barrier if info.distributed else None)
    losses: list[float | None] = []  # the job's loss per step (mean over ranks)
    own_losses: list[float | None] = []  # this rank's (None where it computes none)
    status, reason = "ok", None

    def record(loss: torch.Tensor | None, step: int) -> bool:
        # Outside the timed region; with several ranks one all-reduce, so every
        # rank stops at the same step when any rank's loss is not finite.
        agreed = step_loss(loss, info, device)
        losses.append(agreed.value)
        own_losses.append(agreed.local)
        if not agreed.finite:
            nonlocal status, reason
            status = "diverged"
            reason = f"loss became {agreed.value} at step {step}"
            if info.distributed:
                bad = ", ".join(map(str, agreed.bad_ranks))
                reason = f"loss became non-finite at step {step} on rank {bad}"
            return False
        return True

    for i in range(plan.warmup_steps):
        if not record(setup.step(pool[i % len(pool)], workload.loss), i):
            break
    synchronize(device)
    progress = step_writer(info.rank)  # the tuner's view of a running trial, or None
    with NvmlSampler(device) as nvml:
        for i in range(plan.warmup_steps, plan.warmup_steps + plan.steps):
            if status != "ok":
                break
            with timer.step():
                loss = setup.step(pool[i % len(pool)], workload.loss)
            record(loss, i)
            if progress is not None:  # outside the timed region
                progress(i, timer.times_s[-1])
    mem = memory.end()
    reading = nvml.reading()
    mine = {**mem, "nvml_used": reading.memory_used_peak_bytes if reading else None}
    figures = rank_figures(info, timer.times_s, mine, own_losses)
    figures["energy_j"] = reading.energy_j if reading else None
    ranks = distributed.all_gather(figures)
    job = combine(ranks)
    step_times = job["step_times_s"]

    values = [v for v in losses if v is not None]
    metrics = empty_metrics()
    metrics["loss"] = {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "finite": all(math.isfinite(v) for v in values) if values else None,
        "values": values,
        "warmup_steps": min(plan.warmup_steps, len(values)),
    }
    metrics["memory"] = job["memory"]
    metrics["peak_memory_bytes"] = job["peak_memory_bytes"]
    metrics["per_rank"] = job["per_rank"]
    metrics["notes"] = setup.notes
    if not step_times:
        return metrics, status, reason or "no measured step completed"

    times = step_time_stats(step_times)
    median = times["median"]
    flops_per_step = prep.flops_per_sample * plan.batch_size
    tflops = flops_per_step / median / plan.world_size / 1e12
    peak = prep.peak
    samples_per_s = plan.batch_size / median
    metrics.update(
        step_time_s=times,
        step_times_s=step_times,
        samples_per_s=samples_per_s,
        tokens_per_s=(
            samples_per_s * prep.tokens_per_sample if prep.tokens_per_sample else None
        ),
        flops_per_step=flops_per_step,
        tflops_per_device=tflops,
        mfu=tflops * 1e12 / peak.used.flops,
        mfu_measured_peak=tflops * 1e12 / peak.measured.flops,
        peak_flops_source=peak.used.source,
        peak_flops=peak.as_record(),
        energy_j_per_sample=_energy_per_sample(ranks, len(step_times) * plan.batch_size),
        nvml=dataclasses.asdict(reading) if reading else None,
    )
    if metrics["mfu_measured_peak"] > 1.0:  # impossible unless the peak was measured low
        forget_measured_peak(prep.device, peak.dtype)
        metrics["peak_flops"]["warning"] = (
            "this trial ran above the measured peak, so that calibration was measured low "
            "(a loaded machine?): MFU against it is not meaningful; the cached figure is "
            "dropped and the next trial measures it again")
    return metrics, status, reason


def _energy_per_sample(ranks: list[dict[str, Any]], samples: int) -> float | None:
    """Joules of every rank's device per sample of the job; None unless all have power."""
    joules = [r["energy_j"] for r in ranks]
    if not joules or any(j is None for j in joules):
        return None
    return sum(joules) / samples
