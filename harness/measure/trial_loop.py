"""One trial: build the workload, compose the strategies, train, measure, record.

The loop reads like nanoGPT's bench.py: warm-up steps, then the measured steps as
one window with a synchronisation at each end and none between the steps, so the
host queues a step while the device runs the last one, as training does
(training_harness.measure.timing). Throughput and MFU come from the window; the median
step time and its spread from each step's own time inside it. The losses of the
window stay on the device until it has ended, then are read and checked at once.

The same code runs in every rank of a distributed trial (training_harness.measure.rank_main): each
rank trains its share, the ranks agree on the loss of every step, and their
figures are combined into the job's (training_harness.measure.ranks).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import torch

from training_harness.core.clock import process_age_s
from training_harness.core.errors import HarnessError
from training_harness.core.interference import InterferenceMeter, combine_ranks, session_pids
from training_harness.core.window import window_rule, window_steps
from training_harness.measure import distributed
from training_harness.measure.compile_cost import compile_seconds, compiles
from training_harness.measure.env import capture_env
from training_harness.measure.loader import feed_capacity, step_feed
from training_harness.measure.memory import MemoryTracker, apply_memory_cap, set_expandable_segments
from training_harness.measure.nvml import NvmlReading, NvmlSampler, compute_processes
from training_harness.measure.peaks import forget_measured_peak
from training_harness.measure.prepare import Prepared
from training_harness.measure.rank_process import RankInfo
from training_harness.measure.ranks import LossLog, combine, rank_figures, read_losses, step_loss
from training_harness.measure.timing import SETTLE_STEPS, WindowTimer, step_time_stats, warm_up
from training_harness.records.result import TrialResult, empty_metrics
from training_harness.records.step_log import step_writer
from training_harness.strategies.compose import compose


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
            from training_harness.measure.time_to_target import add_time_to_target

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
    """The trial's steps on this rank and its record's metrics, with its status and reason."""
    info = info or RankInfo()
    plan, device, workload = prep.plan, prep.device, prep.workload
    torch.manual_seed(plan.seed)
    t_setup, started = time.perf_counter(), process_age_s()  # this rank's process, so far
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
    log = LossLog(info.distributed)
    warm = _warm_up(prep, setup, feed, info, log)
    n_window = _window_length(plan, feed, warm)
    # Where a trial's time goes besides its measured steps (issue 13's overhead): the
    # warm-up ends synchronised, each of its losses having been read.
    phases_s = {"start": started, "setup": t_warmup - t_setup,
                "warmup": time.perf_counter() - t_warmup}
    # A barrier (a no-op in one process) and a synchronisation at each end of the window.
    timer = WindowTimer(device, barrier=distributed.barrier)
    window, last_batch, others, reading = _measured_window(
        prep, setup, feed, info, timer, warm.steps, n_window, run=log.status == "ok")
    t_finish = time.perf_counter()
    # The record ends at the first non-finite loss, as when each step was checked.
    for k, agreed in enumerate(read_losses(window, info, device) if window else []):
        if not log.add(agreed, warm.steps + k):
            break
    ranks = _gather_ranks(info, memory, timer, log, reading, others)
    job = combine(ranks)
    metrics = _job_metrics(prep, setup, feed, ranks, job, log, warm, timer, phases_s)
    phases_s["finish"] = time.perf_counter() - t_finish  # the losses read, figures combined
    if not job["step_times_s"]:
        return metrics, log.status, log.reason or "no measured step completed"
    metrics.update(_window_metrics(prep, setup, ranks, job, timer, warm, n_window, reading))
    if setup.length_schedule is not None and plan.target is not None and log.status == "ok":
        metrics.update(_times_by_length(prep, setup, last_batch, metrics))
    if plan.save and log.status == "ok" and info.writes_result:  # harness bench --save
        from training_harness.workloads.trained import save_trained

        metrics["saved"] = save_trained(setup.model, plan.workload, plan.workload_args,
                                        plan.save)
    if metrics["mfu_measured_peak"] > 1.0:  # impossible unless the peak was measured low
        _drop_low_peak(prep, metrics)
    return metrics, log.status, log.reason


@dataclass
class Warmup:
    """What the warm-up found: its steps' seconds, whether they settled, and the
    window's length rule that follows."""

    times: list[float]
    settled: bool | None
    min_window_s: float | None
    step_s: float | None  # this rank's last warm-up steps, their median
    compile_s: float | None  # what torch.compile cost: the warm-up's excess over its steps

    @property
    def steps(self) -> int:
        return len(self.times)


def _warm_up(prep: Prepared, setup: Any, feed: Any, info: RankInfo, log: LossLog) -> Warmup:
    """Warm-up is not timed: each loss is read at once, so a divergence stops it here. It
    runs until the step times settle (up to a cap), and its steps set the window's
    length (at least min_seconds); the ranks decide both together."""
    plan, device, workload = prep.plan, prep.device, prep.workload
    cap, min_window_s = window_rule(plan.warmup_steps, plan.steps, plan.warmup_max_steps,
                                    plan.min_window_s, device.type)
    times, settled = warm_up(
        lambda i: log.add(step_loss(setup.step(feed(i), workload.loss), info, device), i),
        plan.warmup_steps, cap, agree=lambda mine: all(distributed.all_gather(mine)))
    recent = times[-SETTLE_STEPS:]
    step_s = statistics.median(recent) if recent else None
    compile_s = compile_seconds(times, step_s) if compiles(plan.strategies) else None
    return Warmup(times, settled, min_window_s, step_s, compile_s)


def _window_length(plan: Any, feed: Any, warm: Warmup) -> int:
    """The measured steps: the plan's, or enough for min_seconds (the ranks take the
    longest), within what the feed holds."""
    n = window_steps(plan.steps, warm.min_window_s, warm.step_s)
    if warm.min_window_s:
        n = max(distributed.all_gather(n))
    return min(n, feed_capacity(feed) - warm.steps)


def _measured_window(prep: Prepared, setup: Any, feed: Any, info: RankInfo, timer: WindowTimer,
                     first: int, n: int, run: bool) -> tuple[
                         list[torch.Tensor | None], Any, InterferenceMeter, NvmlReading | None]:
    """The measured steps as one window (none unless `run`): their losses, still on the
    device, the last batch, who else used the CPUs and the GPU meanwhile (snapshots
    just outside the window) and NVML's reading."""
    # The trial's processes on this host: the sessions of its ranks here.
    sessions = {sid for host, sid in distributed.all_gather((info.host, os.getsid(0)))
                if host == info.host}
    others = InterferenceMeter(gpu_pids=lambda: compute_processes(prep.device),
                               pids=lambda: session_pids(sessions))
    progress = step_writer(info.rank)  # the tuner's view of a running trial, or None
    losses: list[torch.Tensor | None] = []
    batch = None
    try:
        with NvmlSampler(prep.device) as nvml:
            if run:
                others.start()
                timer.start()
                for i in range(first, first + n):
                    batch = feed(i)  # the last one times a curriculum's lengths
                    loss = setup.step(batch, prep.workload.loss)
                    losses.append(None if loss is None else loss.detach())
                    timer.step_done()
                    _report_done(progress, timer, first)
                timer.finish()
                others.stop()
                _report_done(progress, timer, first)
    finally:  # the lines the writer's thread has not written yet; its thread stops
        if progress is not None:
            progress.close()
    return losses, batch, others, nvml.reading()


def _report_done(progress: Any, timer: WindowTimer, first: int) -> None:
    """Hand the tuner the steps the device has finished; never waits for it."""
    if progress is not None:
        for k, seconds in timer.completed():
            progress(first + k, seconds)


def _gather_ranks(info: RankInfo, memory: MemoryTracker, timer: WindowTimer, log: LossLog,
                  reading: NvmlReading | None, others: InterferenceMeter) -> list[dict[str, Any]]:
    """Every rank's figures: its step times, memory, losses, energy and interference."""
    mem = memory.end(reading.process_used_peak_bytes if reading else None)
    mine = {**mem, "nvml_used": reading.memory_used_peak_bytes if reading else None}
    figures = rank_figures(info, timer.times_s, mine, log.own, timer.window_s)
    figures["energy_j"] = reading.energy_j if reading else None
    figures["interference"] = others.reading()
    return distributed.all_gather(figures)


def _job_metrics(prep: Prepared, setup: Any, feed: Any, ranks: list[dict[str, Any]],
                 job: dict[str, Any], log: LossLog, warm: Warmup, timer: WindowTimer,
                 phases_s: dict[str, float]) -> dict[str, Any]:
    """The metrics every record has, measured steps or not: losses, memory, phases, data."""
    values = [v for v in log.losses if v is not None]
    metrics = empty_metrics()
    metrics["loss"] = {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "finite": all(math.isfinite(v) for v in values) if values else None,
        "values": values,
        "warmup_steps": min(warm.steps, len(values)),
    }
    metrics["memory"] = job["memory"]
    metrics["peak_memory_bytes"] = job["peak_memory_bytes"]
    metrics["per_rank"] = job["per_rank"]
    metrics["notes"] = setup.notes
    # this rank's seconds: its process's start (imports, the workload, the process
    # group), build-and-compose, warm-up, and what follows the measured window
    metrics["phases_s"] = phases_s
    metrics["compile_s"] = warm.compile_s  # None where nothing is compiled
    metrics["interference"] = combine_ranks([r.get("interference") for r in ranks])
    # this rank's data: what it was, and how long its measured steps waited for it
    metrics["data"] = {**feed.record(warm.steps, timer.window_s),
                       "data": prep.workload.data_info()}
    metrics["data_wait_s"] = metrics["data"]["data_wait_s"]
    metrics["data_wait_share"] = metrics["data"]["data_wait_share"]
    return metrics


def _window_metrics(prep: Prepared, setup: Any, ranks: list[dict[str, Any]], job: dict[str, Any],
                    timer: WindowTimer, warm: Warmup, n_window: int,
                    reading: NvmlReading | None) -> dict[str, Any]:
    """The measured window's figures: step times, throughput, MFU over the peak it names,
    energy."""
    plan, peak, step_times = prep.plan, prep.peak, job["step_times_s"]
    flops_per_sample, tokens_per_sample = _work_per_sample(prep, setup, warm.steps,
                                                           len(step_times))
    rates = rate_figures(flops_per_sample, plan.batch_size, len(step_times), job["window_s"],
                         plan.world_size, peak.used.flops, peak.measured.flops)
    samples_per_s = rates["samples_per_s"]
    return dict(
        window={
            "seconds": job["window_s"],
            "steps": len(step_times),
            "samples_per_s": samples_per_s,
            "source": timer.source,
            # how the window was chosen: warm-up until settled, then steps or min_seconds
            "warmup_steps_run": warm.steps,
            "settled": warm.settled,
            "min_seconds": warm.min_window_s,
            "steps_planned": n_window,
            "warmup_step_s": warm.step_s,  # this rank's last warm-up steps, their median
            "energy": "NVML's energy counter over the window (its power figure is a "
                      "1-second average)",
        },
        step_time_s=step_time_stats(step_times),
        step_times_s=step_times,
        tokens_per_s=(samples_per_s * tokens_per_sample if tokens_per_sample else None),
        **rates,
        peak_flops_source=peak.used.source,
        peak_flops=peak.as_record(),
        energy_j_per_sample=_energy_per_sample(ranks, len(step_times) * plan.batch_size),
        nvml=dataclasses.asdict(reading) if reading else None,
    )


def _work_per_sample(prep: Prepared, setup: Any, first: int,
                     steps: int) -> tuple[float, float | None]:
    """FLOPs and tokens per sample of the measured steps: the workload's, or under a
    curriculum the mean of each step's own length."""
    if setup.work_at is None:
        return prep.flops_per_sample, prep.tokens_per_sample
    work = [setup.work_at(i) for i in range(first, first + steps)]
    tokens = statistics.fmean(t for _, t in work) if prep.tokens_per_sample else None
    return statistics.fmean(f for f, _ in work), tokens


def _times_by_length(prep: Prepared, setup: Any, batch: Any,
                     metrics: dict[str, Any]) -> dict[str, Any]:
    """A curriculum's run to the target: its steps timed at their lengths, not at the
    window's (the schedule's shortest); on the window's last batch, so each length's
    step gets the window's mean wait for data."""
    from training_harness.measure import length_times as lt

    wait = (metrics.get("data_wait_s") or 0.0) / len(metrics["step_times_s"])
    times = lt.time_lengths(setup, [batch], prep.workload.loss, prep.device,
                            lt.lengths_to_time(setup.length_schedule), max(prep.plan.steps, 3))
    return {"step_time_by_length_s": {n: t + wait for n, t in times.items()},
            "step_time_by_length_data_wait_s": wait}


def _drop_low_peak(prep: Prepared, metrics: dict[str, Any]) -> None:
    """The trial ran above the measured peak: that calibration was measured low."""
    forget_measured_peak(prep.device, prep.peak.dtype)
    metrics["peak_flops"]["warning"] = (
        "this trial ran above the measured peak, so that calibration was measured low "
        "(a loaded machine?): MFU against it is not meaningful; the cached figure is "
        "dropped, so the next study or bench measures it again (a study keeps the "
        "figures it started with)"
    )


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
