"""From each rank's measurements to the job's: the loss of a step, the step time, the peak.

- The loss of a step is the mean over the ranks that compute one (a pipeline's
  earlier stages compute none); a non-finite loss on any rank stops every rank at
  the same step, so no rank is left waiting in a collective.
- The job's time for a step is the slowest rank's (each step starts after a
  barrier); its peak memory is the largest rank's; every rank's own figures are
  kept under `per_rank`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from harness.measure import distributed
from harness.measure.memory import peak_memory_bytes
from harness.measure.rank_process import RankInfo
from harness.measure.timing import step_time_stats


@dataclass
class StepLoss:
    value: float | None  # the job's loss at this step; None where no rank has one
    local: float | None  # this rank's own loss
    bad_ranks: list[int]  # ranks whose loss is not finite

    @property
    def finite(self) -> bool:
        return not self.bad_ranks


def step_loss(loss: torch.Tensor | None, info: RankInfo, device: torch.device) -> StepLoss:
    """Read this step's loss (a device synchronisation) and agree on it across ranks.

    One all-reduce of world_size + 2 numbers when distributed: a non-finite flag per
    rank, the sum of the finite losses and how many ranks hold one.
    """
    if not info.distributed:
        local = None if loss is None else loss.item()
        bad = [] if local is None or math.isfinite(local) else [info.rank]
        return StepLoss(local, local, bad)
    t = torch.zeros(info.world_size + 2, dtype=torch.float64, device=device)
    local = None
    if loss is not None:
        v = loss.detach().to(torch.float64).reshape(())
        finite = torch.isfinite(v)
        t[info.rank] = (~finite).to(torch.float64)
        t[-2] = torch.where(finite, v, torch.zeros_like(v))
        t[-1] = 1.0
    distributed.all_sum(t)
    values = t.tolist()
    if loss is not None:
        local = loss.item()
    bad = [r for r in range(info.world_size) if values[r] > 0]
    if bad:
        value = math.nan
    elif values[-1] > 0:
        value = values[-2] / values[-1]
    else:
        value = None
    return StepLoss(value, local, bad)


def rank_figures(
    info: RankInfo, times_s: list[float], memory: dict[str, Any], losses: list[float | None]
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
        "peak_memory_bytes": peak_memory_bytes(memory),
        "memory": dict(memory),
        "loss_last": last,
    }


def combine(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's step times, peak memory and memory dict from every rank's figures."""
    runs = [f["step_times_s"] for f in figures]
    steps = min((len(r) for r in runs), default=0)
    job_times = [max(r[i] for r in runs) for i in range(steps)]
    with_peak = [f for f in figures if f["peak_memory_bytes"] is not None]
    largest = max(with_peak, key=lambda f: f["peak_memory_bytes"], default=figures[0])
    per_rank = [{k: v for k, v in f.items() if k != "step_times_s"} for f in figures]
    return {
        "step_times_s": job_times,
        "peak_memory_bytes": largest["peak_memory_bytes"],
        # The largest rank's memory dict, whole, so its figures belong together.
        "memory": dict(largest["memory"]),
        "per_rank": per_rank,
    }
