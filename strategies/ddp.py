"""Data parallel: DistributedDataParallel over the mesh's "data" ranks.

Each data rank holds the whole model and a share of the global batch; DDP
averages the gradients in buckets while backward runs. Gradients may travel
compressed (fp16/bf16, torch's comm hooks). With accumulation the all-reduce
runs on the last micro-step only (DDP's no_sync on the others).

compression = "powersgd" is the seed's "communication warm-up": torch's PowerSGD
hook (powerSGD_hook, layer-wise) all-reduces the full gradients for the first
`start_powersgd_iter` optimizer steps, then each 2-D gradient matrix n x m (a
convolution's viewed as out x rest) as rank-r factors P (n x r) and Q (m x r),
(n + m) r elements instead of n m, with torch's error feedback and warm start;
1-D tensors and matrices too small to gain 2x (torch's min_compression_rate) go
whole. The hook counts its own iterations, one per backward whose all-reduce runs:
with no_sync on all but the last micro-step that is one per optimizer step. It
changes the gradients, so it is judged by time to a target loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.mesh import group
from training_harness.strategies.registry import register
from training_harness.strategies.setup import Setup

HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


@dataclass
class DdpSettings:
    bucket_cap_mb: float = 25.0  # gradients all-reduced per bucket of this size
    # the gradients' dtype on the wire, or PowerSGD's low-rank factors
    compression: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    gradient_as_bucket_view: bool = True  # .grad views the bucket: no extra copy
    # compression "powersgd" only (ignored otherwise): its matrix_approximation_rank, and
    # the optimizer steps of plain all-reduce before it starts (torch's defaults)
    powersgd_rank: int = 1
    start_powersgd_iter: int = 1000

    def validate(self, where: str) -> None:
        if not self.bucket_cap_mb > 0:
            raise HarnessError(f"{where}.bucket_cap_mb: must be above 0")
        if self.powersgd_rank < 1:
            raise HarnessError(f"{where}.powersgd_rank: must be 1 or more")
        if self.start_powersgd_iter < 2:
            # torch's PowerSGDState refuses it with error feedback or warm start (on):
            # DDP rebuilds its buckets after the first step, the buffers' shapes change
            raise HarnessError(f"{where}.start_powersgd_iter: must be 2 or more (torch's "
                               "PowerSGD starts after DDP's first two steps)")


def data_parallel_reasons(name: str, plan, uses_ddp: bool) -> list[str]:
    """What ddp and zero both need of the layout, in words."""
    reasons = []
    if plan.layout.data < 2:
        reasons.append(
            f"{name} replicates the model over data-parallel ranks, but layout data = "
            f"{plan.layout.data}; set [layout] data = 2 or more"
        )
    if {"ddp", "zero"} <= plan.strategies.keys():
        reasons.append(
            "ddp and zero are mutually exclusive: zero wraps the model itself (DDP with a "
            "sharded optimizer for stage 1, FSDP2 for stages 2/3); keep one of them"
        )
    if uses_ddp and plan.layout.tensor > 1:
        reasons.append(
            f"{name} wraps the model in DDP, which does not take tensor-parallel (DTensor) "
            "parameters; use zero with stage = 2 or 3 beside tensor parallel"
        )
    if uses_ddp and "pipeline" in plan.strategies:
        # torch 2.13: the reducer's bucket rebuild fails after the first step on a
        # stage that runs several micro-batches (and static_graph=True gives wrong
        # gradients); FSDP2 stages work. torchtitan refuses DDP with PP likewise.
        reasons.append(
            f"{name} wraps the model in DDP, which torch's pipeline schedules do not "
            "drive correctly; use zero with stage = 2 or 3 beside pipeline"
        )
    return reasons


def wrap_ddp(setup: Setup, who: str, bucket_cap_mb: float = 25.0, compression: str = "none",
             gradient_as_bucket_view: bool = True, powersgd: DdpSettings | None = None,
             pg=None) -> powerSGD_hook.PowerSGDState | None:
    """Wrap the model in DDP over the "data" ranks (or `pg`); its no_sync skips the
    all-reduce. `powersgd`: the settings of compression "powersgd"; its hook's state
    is returned (None without it)."""
    pg = pg if pg is not None else group(setup.mesh, "data", who)
    ddp = DistributedDataParallel(
        setup.model, process_group=pg, bucket_cap_mb=bucket_cap_mb,
        device_ids=[setup.device.index] if setup.device.type == "cuda" else None,
        gradient_as_bucket_view=gradient_as_bucket_view,
    )
    state = None
    if compression == "powersgd":
        assert powersgd is not None
        # the rank and warm-up asked for, torch's defaults for the rest (error feedback and
        # warm start on, min_compression_rate 2, random_seed 0 on every rank so that all
        # draw the same Q). Its `iter` counts backward passes whose all-reduce runs:
        # optimizer steps, with no_sync on the other micro-steps (checked).
        state = powerSGD_hook.PowerSGDState(
            process_group=pg, matrix_approximation_rank=powersgd.powersgd_rank,
            start_powerSGD_iter=powersgd.start_powersgd_iter)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif compression != "none":
        ddp.register_comm_hook(pg, HOOKS[compression])
    setup.model = ddp
    setup.no_sync = ddp.no_sync
    return state


class Ddp(Strategy):
    name = "ddp"
    summary = "DistributedDataParallel over the data ranks; bucket size, gradient compression"
    phases = (Phase.DATA_PARALLEL,)
    Settings = DdpSettings
    requires = ("layout data >= 2; bf16 compression: NCCL on CUDA; powersgd: all-reduce on "
                "the last micro-step only")
    distributed = True

    def space(self):
        return {
            "bucket_cap_mb": Choice((5.0, 25.0, 100.0)),
            "compression": Choice(("none", "fp16", "bf16", "powersgd")),
            # two values each: 48 combinations with the others, under the 64 that
            # training_harness.study.refusals checks whole; a study may list more
            "powersgd_rank": Choice((1, 4)),
            "start_powersgd_iter": Choice((10, 1000)),
        }

    def check(self, settings, plan, env):
        reasons = data_parallel_reasons("ddp", plan, uses_ddp=True)
        if settings.compression == "bf16" and env.device_type != "cuda":
            reasons.append(
                "ddp compression 'bf16' needs CUDA with NCCL (torch refuses its bf16 hook on "
                "gloo); use compression = 'fp16' or 'none' on the CPU"
            )
        if settings.compression == "powersgd":
            reasons += powersgd_reasons(plan)
        return reasons

    def apply(self, phase, setup, settings):
        wrap_ddp(setup, "ddp", settings.bucket_cap_mb, settings.compression,
                 settings.gradient_as_bucket_view, settings)
        how = settings.compression
        if how == "powersgd":
            how += (f" rank {settings.powersgd_rank} after {settings.start_powersgd_iter} "
                    "steps of plain all-reduce")
        setup.notes.append(
            f"ddp: {setup.mesh['data'].size()} data ranks, buckets of "
            f"{settings.bucket_cap_mb:g} MB, compression {how}"
        )
        warm = setup.plan.warmup_steps if setup.plan is not None else 0
        if settings.compression == "powersgd" and warm < settings.start_powersgd_iter:
            setup.notes.append(
                f"ddp: PowerSGD starts at step {settings.start_powersgd_iter}, after the "
                f"{warm} warm-up steps: measured steps before it are plain all-reduce's; "
                f"warmup_steps = {settings.start_powersgd_iter} or more times compressed ones")


def powersgd_of(plan) -> DdpSettings | None:
    """The plan's ddp settings where it compresses with PowerSGD, else None."""
    table = plan.strategies.get("ddp")
    if table is None:
        return None
    settings = DDP.parse(table, "[strategies.ddp]")
    return settings if settings.compression == "powersgd" else None


@contextlib.contextmanager
def alone(device: torch.device) -> Iterator[dist.ProcessGroup]:
    """A process group of this process alone: PowerSGD in the one-process run to a target
    loss (training_harness.measure.convergence), whose hook needs a group to all-reduce
    over. What torch's hook computes depends on the ranks' mean gradient only: P and Q
    are sums over ranks of linear maps of each rank's gradient (with the same random Q
    on every rank), the uncompressed tensors are averaged, and the error-feedback
    tensors average to the one-process run's. So one process on the global batch trains
    what the data ranks train (tests/distributed/test_powersgd.py holds it)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():  # a rank of a distributed trial: a group of its own
        pg = dist.new_group([dist.get_rank()], backend=backend,
                            use_local_synchronization=True)
        try:
            yield pg
        finally:
            dist.destroy_process_group(pg)
        return
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def powersgd_reasons(plan) -> list[str]:
    """What compression "powersgd" needs of the rest of the plan, in words."""
    acc = plan.strategies.get("accumulation")
    if acc is not None and acc.get("sync_last_only") is False and plan.accumulation_steps > 1:
        # every micro-step's all-reduce would be compressed and counted as a step of
        # the warm-up, unlike the one-process run to the target
        return ["ddp compression 'powersgd' compresses one all-reduce per optimizer step; "
                "set [strategies.accumulation] sync_last_only = true"]
    return []


DDP = register(Ddp())
