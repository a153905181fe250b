"""Small helpers for the ranks of one trial: who am I, the process group, collectives.

A trial with world size N runs as N processes (forked from the rank server, or
started by torchrun: see training_harness.launch.local), each told its place through
torchrun's environment variables (env:// init: MASTER_ADDR, MASTER_PORT).
With one process none of these helpers touches torch.distributed: a single
process trial never creates a process group.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from training_harness.core.errors import HarnessError
from training_harness.measure.rank_process import RankInfo

COLLECTIVE_MARGIN_S = 60.0  # past the plan's timeout (see init)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(plan: Any, device: torch.device, info: RankInfo | None = None) -> RankInfo:
    """Join the trial's process group when there is more than one rank.

    A collective that waits COLLECTIVE_MARGIN_S longer than the plan's timeout raises
    instead of hanging for ever. The launcher's deadline (the plan's timeout, counted
    from before the ranks started) must come first: it asks each rank where it is,
    and a forked rank reaches its first collective within a second or two, so a
    collective timing out at the plan's timeout would fail the waiting rank just
    then, with an error that names it rather than the rank that hung.
    """
    info = info or RankInfo.from_env()
    if info.world_size != plan.world_size:
        raise HarnessError(
            f"the plan's layout has {plan.world_size} ranks but {info.world_size} were "
            "started; launch it with training_harness.launch.local (or torchrun --nproc-per-node "
            f"{plan.world_size})"
        )
    if not info.distributed or dist.is_initialized():
        return info
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(
        backend_for(device),
        timeout=datetime.timedelta(seconds=plan.timeout_s + COLLECTIVE_MARGIN_S),
        rank=info.rank,
        world_size=info.world_size,
        **kwargs,
    )
    return info


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def all_gather(obj: Any) -> list[Any]:
    """`obj` of every rank, in rank order, on every rank ([obj] in one process).

    For small picklable figures only (step times, memory peaks): it pickles.
    """
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks, in place (unchanged in one process)."""
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
