"""Small helpers for the ranks of one trial: who am I, the process group, collectives.

A trial with world size N runs as N processes started by torchrun (see
harness.launch.local), which tells each its place through environment variables.
With one process none of these helpers touches torch.distributed: a single
process trial never creates a process group.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from harness.core.errors import HarnessError

# Set by harness.launch.local on every process of a trial: the --node-rank this node was
# launched with. c10d rendezvous numbers nodes by its own order (GROUP_RANK), so the
# launched node rank is what says which node's launcher collects the record.
NODE_RANK_ENV = "HARNESS_NODE_RANK"
# The start of the first line every rank writes to its stderr (harness.measure.rank_main),
# followed by RankInfo.describe(): how the launcher tells the ranks' logs apart.
LOG_HEADER = "harness worker:"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the trial, as torchrun's environment says."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0  # the node's index as the rendezvous numbered it
    launch_node_rank: int = 0  # the --node-rank this node was launched with
    host: str = field(default_factory=socket.gethostname)

    @classmethod
    def from_env(cls) -> RankInfo:
        return cls(
            rank=_env_int("RANK", 0),
            world_size=_env_int("WORLD_SIZE", 1),
            local_rank=_env_int("LOCAL_RANK", 0),
            local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
            group_rank=_env_int("GROUP_RANK", 0),
            launch_node_rank=_env_int(NODE_RANK_ENV, 0),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def writes_result(self) -> bool:
        """The one process that writes the record: local rank 0 of launched node 0.

        On one node that is rank 0. On several nodes it is the first process on the
        node whose launcher was given --node-rank 0, so the record lands where that
        launcher looks for it, shared file system or not.
        """
        return self.launch_node_rank == 0 and self.local_rank == 0

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.world_size}, local rank {self.local_rank}, "
            f"node {self.group_rank} (launched as {self.launch_node_rank}), host {self.host}"
        )


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(plan: Any, device: torch.device, info: RankInfo | None = None) -> RankInfo:
    """Join the trial's process group when there is more than one rank.

    A collective that waits longer than the plan's timeout raises instead of
    hanging for ever (the launcher's own timeout usually comes first).
    """
    info = info or RankInfo.from_env()
    if info.world_size != plan.world_size:
        raise HarnessError(
            f"the plan's layout has {plan.world_size} ranks but {info.world_size} were "
            "started; launch it with harness.launch.local (or torchrun --nproc-per-node "
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
        timeout=datetime.timedelta(seconds=plan.timeout_s),
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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS may hand it out again later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
