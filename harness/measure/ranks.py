"""From each rank's measurements to the job's: the loss of a step, the step time, the peak.

- The loss of a step is the mean over the ranks that compute one (a pipeline's
  earlier stages compute none); the ranks agree on it in one all-reduce, so a
  non-finite loss on any rank ends every rank's record at the same step and no
  rank is left waiting in a collective. Warm-up steps agree step by step (a
  divergence stops them at once); the measured window's losses are read and
  agreed once, after it, so that reading them does not synchronise each step.
- Each rank times its own steps inside the measured window (training_harness.measure.timing):
  the job's time for a step is the slowest rank's, and the job's window the slowest
  rank's window; its peak memory is the largest rank's; every rank's own figures
  are kept under `per_rank`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from training_harness.measure import distributed
from training_harness.measure.memory import peak_memory_bytes
from training_harness.measure.rank_process import RankInfo
from training_harness.measure.timing import step_time_stats


@dataclass
class StepLoss:
    value: float | None  # the job's loss at this step; None where no rank has one
    local: float | None  # this rank's own loss
    bad_ranks: list[int]  # ranks whose loss is not finite

    @property
    def finite(self) -> bool:
        return not self.bad_ranks


@dataclass
class LossLog:
    """The job's loss per step (the mean over ranks) and this rank's (None where it
    computes none); the first non-finite one makes the trial diverged. Every rank holds
    the same agreed losses, so all stop at the same step."""

    distributed: bool
    losses: list[float | None] = field(default_factory=list)
    own: list[float | None] = field(default_factory=list)
    status: str = "ok"
    reason: str | None = None

    def add(self, agreed: StepLoss, step: int) -> bool:
        """Record step `step`'s loss; False when it is not finite (the trial stops)."""
        self.losses.append(agreed.value)
        self.own.append(agreed.local)
        if agreed.finite:
            return True
        self.status = "diverged"
        self.reason = f"loss became {agreed.value} at step {step}"
        if self.distributed:
            bad = ", ".join(map(str, agreed.bad_ranks))
            self.reason = f"loss became non-finite at step {step} on rank {bad}"
        return False


def step_loss(loss: torch.Tensor | None, info: RankInfo, device: torch.device) -> StepLoss:
    """Read one step's loss (a device synchronisation) and agree on it across ranks
    (one all-reduce of world_size + 2 numbers when distributed): for warm-up steps,
    where a divergence stops the trial at once."""
    return read_losses([loss], info, device)[0]


def read_losses(
    losses: list[torch.Tensor | None], info: RankInfo, device: torch.device
) -> list[StepLoss]:
    """Every step's loss, read at once after the measured window, and agreed across ranks.

    Reading a loss synchronises with the device, so the window keeps them as device
    tensors; here they are stacked and copied to the host once, and with several
    ranks the whole [steps x (world_size + 2)] table of `loss_rows` is summed in ONE
    all-reduce (not one per step). Every rank passes the same number of steps.
    """
    present = [t.detach().to(torch.float64).reshape(()) for t in losses if t is not None]
    values = iter(torch.stack(present).cpu().tolist() if present else [])
    local = [None if t is None else next(values) for t in losses]
    if not info.distributed:
        return agree_losses(local, None, info.rank)
    if not losses:
        return []
    table = torch.tensor(loss_rows(local, info.rank, info.world_size), dtype=torch.float64)
    summed = distributed.all_sum(table.to(device)).cpu().tolist()
    return agree_losses(local, summed, info.rank)


def loss_rows(local: list[float | None], rank: int, world_size: int) -> list[list[float]]:
    """This rank's share of the table summed over the ranks, one row per step: a
    non-finite flag in its own column, then its loss if finite (else 0) and 1 if it
    computes a loss at all (a pipeline's earlier stages do not)."""
    rows = []
    for v in local:
        row = [0.0] * (world_size + 2)
        if v is not None:
            finite = math.isfinite(v)
            row[rank] = 0.0 if finite else 1.0
            row[-2] = v if finite else 0.0
            row[-1] = 1.0
        rows.append(row)
    return rows


def agree_losses(
    local: list[float | None], summed: list[list[float]] | None, rank: int
) -> list[StepLoss]:
    """Each step's StepLoss from this rank's own losses and the table summed over the
    ranks (`summed`; None in a one-process trial, where the job's loss is this one's).

    The job's loss is the mean over the ranks that computed one, NaN where any
    rank's is not finite (those ranks are `bad_ranks`), None where none has one."""
    if summed is None:
        return [StepLoss(v, v, [] if v is None or math.isfinite(v) else [rank]) for v in local]
    agreed = []
    for v, row in zip(local, summed, strict=True):
        bad = [r for r in range(len(row) - 2) if row[r] > 0]
        if bad:
            value = math.nan
        elif row[-1] > 0:
            value = row[-2] / row[-1]
        else:
            value = None
        agreed.append(StepLoss(value, v, bad))
    return agreed


def rank_figures(
    info: RankInfo,
    times_s: list[float],
    memory: dict[str, Any],
    losses: list[float | None],
    window_s: float | None = None,
) -> dict[str, Any]:
    """What this rank measured, small enough to gather."""
    last = next((v for v in reversed(losses) if v is not None), None)
    return {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "node": info.group_rank,
        "launched_node": info.launch_node_rank,
        "host": info.host,
        "step_time_median_s": step_time_stats(times_s)["median"] if times_s else None,
        "step_times_s": list(times_s),
        "window_s": window_s,
        "peak_memory_bytes": peak_memory_bytes(memory),
        "memory": dict(memory),
        "loss_last": last,
    }


def combine(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's step times, window, peak memory and memory dict from every rank's figures."""
    runs = [f["step_times_s"] for f in figures]
    steps = min((len(r) for r in runs), default=0)
    job_times = [max(r[i] for r in runs) for i in range(steps)]
    windows = [f.get("window_s") for f in figures]
    with_peak = [f for f in figures if f["peak_memory_bytes"] is not None]
    largest = max(with_peak, key=lambda f: f["peak_memory_bytes"], default=figures[0])
    per_rank = [{k: v for k, v in f.items() if k != "step_times_s"} for f in figures]
    return {
        "step_times_s": job_times,
        # The slowest rank's window; None unless every rank timed one.
        "window_s": max(windows) if windows and None not in windows else None,
        "peak_memory_bytes": largest["peak_memory_bytes"],
        # The largest rank's memory dict, whole, so its figures belong together.
        "memory": dict(largest["memory"]),
        "per_rank": per_rank,
    }
