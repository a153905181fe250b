"""Data parallel: DistributedDataParallel over the mesh's "data" ranks.

Each data rank holds the whole model and a share of the global batch; DDP
averages the gradients in buckets while backward runs. Gradients may travel
compressed (fp16/bf16, torch's comm hooks). With accumulation the all-reduce
runs on the last micro-step only (DDP's no_sync on the others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
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
    compression: Literal["none", "fp16", "bf16"] = "none"  # gradients' dtype on the wire
    gradient_as_bucket_view: bool = True  # .grad views the bucket: no extra copy

    def validate(self, where: str) -> None:
        if not self.bucket_cap_mb > 0:
            raise HarnessError(f"{where}.bucket_cap_mb: must be above 0")


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
             gradient_as_bucket_view: bool = True) -> None:
    """Wrap the model in DDP over the "data" ranks; its no_sync skips the all-reduce."""
    pg = group(setup.mesh, "data", who)
    ddp = DistributedDataParallel(
        setup.model, process_group=pg, bucket_cap_mb=bucket_cap_mb,
        device_ids=[setup.device.index] if setup.device.type == "cuda" else None,
        gradient_as_bucket_view=gradient_as_bucket_view,
    )
    if compression != "none":
        ddp.register_comm_hook(pg, HOOKS[compression])
    setup.model = ddp
    setup.no_sync = ddp.no_sync


class Ddp(Strategy):
    name = "ddp"
    summary = "DistributedDataParallel over the data ranks; bucket size, gradient compression"
    phases = (Phase.DATA_PARALLEL,)
    Settings = DdpSettings
    requires = "layout data >= 2; bf16 compression: NCCL on CUDA"
    distributed = True

    def space(self):
        return {
            "bucket_cap_mb": Choice((5.0, 25.0, 100.0)),
            "compression": Choice(("none", "fp16", "bf16")),
        }

    def check(self, settings, plan, env):
        reasons = data_parallel_reasons("ddp", plan, uses_ddp=True)
        if settings.compression == "bf16" and env.device_type != "cuda":
            reasons.append(
                "ddp compression 'bf16' needs CUDA with NCCL (torch refuses its bf16 hook on "
                "gloo); use compression = 'fp16' or 'none' on the CPU"
            )
        return reasons

    def apply(self, phase, setup, settings):
        wrap_ddp(setup, "ddp", settings.bucket_cap_mb, settings.compression,
                 settings.gradient_as_bucket_view)
        setup.notes.append(
            f"ddp: {setup.mesh['data'].size()} data ranks, buckets of "
            f"{settings.bucket_cap_mb:g} MB, compression {settings.compression}"
        )


register(Ddp())
