"""One trial: build the workload, compose the strategies, train, measure, record.

The loop reads like nanoGPT's bench.py: warm-up steps, then the measured steps as
one window with a synchronisation at each end and none between the steps, so the
host queues a step while the device runs the last one, as training does
(harness.measure.timing). Throughput and MFU come from the window; the median
step time and its spread from each step's own time inside it. The losses of the
window stay on the device until it has ended, then are read and checked at once.

The same code runs in every rank of a distributed trial (harness.measure.rank_main): each
rank trains its share, the ranks agree on the loss of every step, and their
figures are combined into the job's (harness.measure.ranks).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
import traceback
from datetime import UTC, datetime
from typing import Any

import torch

from harness.core.clock import process_age_s
from harness.core.errors import HarnessError
from harness.core.interference import InterferenceMeter, combine_ranks, session_pids
from harness.measure import distributed
from harness.measure.compile_cost import compile_seconds, compiles
from harness.measure.env import capture_env
from harness.measure.loader import feed_capacity, step_feed
from harness.measure.memory import MemoryTracker, apply_memory_cap, set_expandable_segments
from harness.measure.nvml import NvmlSampler, compute_processes
from harness.measure.peak_calibration import forget_measured_peak
from harness.measure.prepare import Prepared
from harness.measure.rank_process import RankInfo
from harness.measure.ranks import StepLoss, combine, rank_figures, read_losses, step_loss
from harness.measure.timing import (
    SETTLE_STEPS,
    WindowTimer,
    step_time_stats,
    warm_up,
    window_rule,
    window_steps,
)
from harness.records.result import TrialResult, empty_metrics
from harness.records.step_log import step_writer
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
        if prep.plan.target is not None and result.status == "ok" and info.writes_result:
            # after the measured steps, off their clock; one process trains to the target
            from harness.measure.time_to_target import add_time_to_target

            t_target = time.perf_counter()
            result.status, result.reason = add_time_to_target(prep, result.metrics)
            result.metrics.setdefault("phases_s", {})["time_to_target"] = (
                time.perf_counter() - t_target)
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


def measure(prep: Prepared, info: RankInfo | None = None) -> tuple[dict[str, Any], str, str | None]:
    info = info or RankInfo()
    plan, device, workload = prep.plan, prep.device, prep.workload
    torch.manual_seed(plan.seed)
    t_setup = time.perf_counter()
    started = process_age_s()  # this rank's process, from its start to here
    memory = MemoryTracker(device)
    memory.begin()
    # Under a study's memory budget: the allocator frees its cache before it passes it
    set_expandable_segments(device, plan.expandable_segments)
    memory.cap_bytes = apply_memory_cap(device, plan.memory_budget_bytes, memory.context_bytes)
    with torch.device(device):
        model = workload.build_model()
    setup = compose(model, plan, device, prep.runtime)
    feed = step_feed(plan, workload, device, data_rank=plan.layout.coordinates(info.rank)[1],
                     local_ranks=info.local_world_size)
    t_warmup = time.perf_counter()
    # A barrier (a no-op in one process) and a synchronisation at each end of the window.
    timer = WindowTimer(device, barrier=distributed.barrier)
    losses: list[float | None] = []  # the job's loss per step (mean over ranks)
    own_losses: list[float | None] = []  # this rank's (None where it computes none)
    status, reason = "ok", None

    def record(agreed: StepLoss, step: int) -> bool:
        # Every rank holds the same agreed losses, so all stop at the same step.
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

    # Warm-up is not timed: each loss is read at once, so a divergence stops it here. It
    # runs until the step times settle (up to a cap), and its steps set the window's
    # length (at least min_seconds); the ranks decide both together.
    warmup_cap, min_window_s = window_rule(plan.warmup_steps, plan.steps, plan.warmup_max_steps,
                                           plan.min_window_s, device.type)
    warm_times, is_settled = warm_up(
        lambda i: record(step_loss(setup.step(feed(i), workload.loss), info, device), i),
        plan.warmup_steps, warmup_cap, agree=lambda mine: all(distributed.all_gather(mine)))
    recent = warm_times[-SETTLE_STEPS:]
    warm_step_s = statistics.median(recent) if recent else None
    # what torch.compile cost this trial: the warm-up's excess over its settled steps
    compile_s = compile_seconds(warm_times, warm_step_s) if compiles(plan.strategies) else None
    n_window = window_steps(plan.steps, min_window_s, warm_step_s)
    if min_window_s:
        n_window = max(distributed.all_gather(n_window))
    n_window = min(n_window, feed_capacity(feed) - len(warm_times))
    # Where a trial's time goes besides its measured steps (issue 13's overhead): the
    # warm-up ends synchronised, each of its losses having been read.
    phases_s = {"start": started, "setup": t_warmup - t_setup,
                "warmup": time.perf_counter() - t_warmup}
    first = len(warm_times)
    window: list[torch.Tensor | None] = []  # the window's losses, still on the device
    progress = step_writer(info.rank)  # the tuner's view of a running trial, or None

    def report_done() -> None:  # steps the device has finished; never waits for it
        if progress is not None:
            for k, seconds in timer.completed():
                progress(first + k, seconds)

    # Who else used the CPUs and the GPU meanwhile: snapshots just outside the window.
    # The trial's processes on this host: the sessions of its ranks here.
    sessions = {sid for host, sid in distributed.all_gather((info.host, os.getsid(0)))
                if host == info.host}
    others = InterferenceMeter(gpu_pids=lambda: compute_processes(device),
                               pids=lambda: session_pids(sessions))
    try:
        with NvmlSampler(device) as nvml:
            if status == "ok":
                others.start()
                timer.start()
                for i in range(first, first + n_window):
                    batch = feed(i)  # the last one times a curriculum's lengths, below
                    loss = setup.step(batch, workload.loss)
                    window.append(None if loss is None else loss.detach())
                    timer.step_done()
                    report_done()
                timer.finish()
                others.stop()
                report_done()
    finally:  # the lines the writer's thread has not written yet; its thread stops
        if progress is not None:
            progress.close()
    t_finish = time.perf_counter()
    # The record ends at the first non-finite loss, as when each step was checked.
    for k, agreed in enumerate(read_losses(window, info, device) if window else []):
        if not record(agreed, first + k):
            break
    reading = nvml.reading()
    mem = memory.end(reading.process_used_peak_bytes if reading else None)
    mine = {**mem, "nvml_used": reading.memory_used_peak_bytes if reading else None}
    figures = rank_figures(info, timer.times_s, mine, own_losses, timer.window_s)
    figures["energy_j"] = reading.energy_j if reading else None
    figures["interference"] = others.reading()
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
        "warmup_steps": min(first, len(values)),
    }
    metrics["memory"] = job["memory"]
    metrics["peak_memory_bytes"] = job["peak_memory_bytes"]
    metrics["per_rank"] = job["per_rank"]
    metrics["notes"] = setup.notes
    # this rank's seconds: its process's start (imports, the workload, the process
    # group), build-and-compose, warm-up, and (below) what follows the measured window
    metrics["phases_s"] = phases_s
    metrics["compile_s"] = compile_s  # None where nothing is compiled
    metrics["interference"] = combine_ranks([r.get("interference") for r in ranks])
    # this rank's data: what it was, and how long its measured steps waited for it
    metrics["data"] = {**feed.record(first, timer.window_s), "data": workload.data_info()}
    metrics["data_wait_s"] = metrics["data"]["data_wait_s"]
    metrics["data_wait_share"] = metrics["data"]["data_wait_share"]
    phases_s["finish"] = time.perf_counter() - t_finish  # the losses read, figures combined
    if not step_times:
        return metrics, status, reason or "no measured step completed"

    times = step_time_stats(step_times)
    window_s = job["window_s"]
    peak = prep.peak
    flops_per_sample, tokens_per_sample = prep.flops_per_sample, prep.tokens_per_sample
    if setup.work_at is not None:  # the curriculum: each measured step at its own length
        work = [setup.work_at(i) for i in range(first, first + len(step_times))]
        flops_per_sample = statistics.fmean(f for f, _ in work)
        tokens_per_sample = statistics.fmean(t for _, t in work) if tokens_per_sample else None
    rates = rate_figures(flops_per_sample, plan.batch_size, len(step_times), window_s,
                         plan.world_size, peak.used.flops, peak.measured.flops)
    samples_per_s = rates["samples_per_s"]
    metrics.update(
        window={
            "seconds": window_s,
            "steps": len(step_times),
            "samples_per_s": samples_per_s,
            "source": timer.source,
            # how the window was chosen: warm-up until settled, then steps or min_seconds
            "warmup_steps_run": first,
            "settled": is_settled,
            "min_seconds": min_window_s,
            "steps_planned": n_window,
            "warmup_step_s": warm_step_s,  # this rank's last warm-up steps, their median
            "energy": "NVML's energy counter over the window (its power figure is a "
                      "1-second average)",
        },
        step_time_s=times,
        step_times_s=step_times,
        tokens_per_s=(samples_per_s * tokens_per_sample if tokens_per_sample else None),
        **rates,
        peak_flops_source=peak.used.source,
        peak_flops=peak.as_record(),
        energy_j_per_sample=_energy_per_sample(ranks, len(step_times) * plan.batch_size),
        nvml=dataclasses.asdict(reading) if reading else None,
    )
    if setup.length_schedule is not None and plan.target is not None and status == "ok":
        # a curriculum's run to the target: its steps timed at their lengths, not at the
        # window's (the schedule's shortest); on the window's last batch, so each length's
        # step gets the window's mean wait for data
        from harness.measure import length_times as lt

        wait = (metrics.get("data_wait_s") or 0.0) / len(step_times)
        metrics["step_time_by_length_s"] = {n: t + wait for n, t in lt.time_lengths(
            setup, [batch], workload.loss, device,
            lt.lengths_to_time(setup.length_schedule), max(plan.steps, 3)).items()}
        metrics["step_time_by_length_data_wait_s"] = wait
    if plan.save and status == "ok" and info.writes_result:  # harness bench --save
        from harness.workloads.trained import save_trained

        metrics["saved"] = save_trained(setup.model, plan.workload, plan.workload_args,
                                        plan.save)
    if metrics["mfu_measured_peak"] > 1.0:  # impossible unless the peak was measured low
        forget_measured_peak(prep.device, peak.dtype)
        metrics["peak_flops"]["warning"] = (
            "this trial ran above the measured peak, so that calibration was measured low "
            "(a loaded machine?): MFU against it is not meaningful; the cached figure is "
            "dropped, so the next study or bench measures it again (a study keeps the "
            "figures it started with)"
        )
    return metrics, status, reason


def rate_figures(flops_per_sample: float, batch: int, steps: int, window_s: float, world: int,
                 peak_flops: float, measured_peak_flops: float) -> dict[str, float]:
    """Throughput and MFU from the window: its mean step overlaps its neighbours as in
    training. MFU = model FLOPs per step / step time / devices / peak."""
    step_s = window_s / steps
    flops_per_step = flops_per_sample * batch
    tflops = flops_per_step / step_s / world / 1e12
    return {"samples_per_s": batch / step_s, "flops_per_step": flops_per_step,
            "tflops_per_device": tflops, "mfu": tflops * 1e12 / peak_flops,
            "mfu_measured_peak": tflops * 1e12 / measured_peak_flops}


def _energy_per_sample(ranks: list[dict[str, Any]], samples: int) -> float | None:
    """Joules of every rank's device per sample of the job; None unless all have power."""
    joules = [r["energy_j"] for r in ranks]
    if not joules or any(j is None for j in joules):
        return None
    return sum(joules) / samples
