"""ZeRO over the mesh's "data" ranks: shard optimizer state, then gradients, then parameters.

  stage 1: ZeroRedundancyOptimizer - each rank keeps the optimizer state of its
           share of the parameters; DDP still all-reduces the whole gradient.
  stage 2: FSDP2 `fully_shard` keeping the gathered parameters from forward to
           backward (reshard_after_forward=False): gradients and optimizer
           state sharded, one all-gather per step.
  stage 3: `fully_shard` resharding after forward: parameters sharded too,
           gathered again in backward; optionally offloaded to the CPU.

FSDP2 shards each block, then the root, so blocks are gathered one at a time.
With amp, FSDP's mixed-precision policy computes with bf16/fp16 copies of the
parameters and reduces gradients in fp32 (autocast stays on as well); fp16's
loss scaler is then torch's ShardedGradScaler (see strategies.amp), which agrees
on inf/NaN over all ranks. With accumulation, gradients are reduced on the last
micro-step only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from training_harness.core.interference import cpus
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.ddp import data_parallel_reasons, wrap_ddp
from training_harness.strategies.mesh import group, submesh
from training_harness.strategies.pipeline import local_stages
from training_harness.strategies.registry import register
from training_harness.workloads.blocks import find_blocks

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class ZeroSettings:
    stage: Literal[1, 2, 3] = 2
    offload: bool = False  # stage 3: parameters, gradients and optimizer state on the CPU
    mixed_precision: bool = True  # with amp: FSDP computes in amp's dtype, reduces in fp32


class Zero(Strategy):
    name = "zero"
    summary = "ZeRO 1/2/3: sharded optimizer state (ZeroRedundancyOptimizer), FSDP2 for 2/3"
    phases = (Phase.DATA_PARALLEL, Phase.OPTIMIZER)
    Settings = ZeroSettings
    requires = "layout data >= 2; offload: stage 3"
    distributed = True

    def space(self):
        return {"stage": Choice((1, 2, 3)), "offload": Choice((False, True))}

    def check(self, settings, plan, env):
        reasons = data_parallel_reasons(
            f"zero stage {settings.stage}", plan, uses_ddp=settings.stage == 1
        )
        if settings.offload and settings.stage != 3:
            reasons.append(
                f"zero offload moves sharded parameters to the CPU between uses: stage 3 "
                f"only, not stage {settings.stage}; set stage = 3 or offload = false"
            )
        return reasons

    def apply(self, phase, setup, settings):
        if phase is Phase.DATA_PARALLEL:
            if settings.stage == 1:
                wrap_ddp(setup, "zero")
            else:
                shard(setup, settings)
            ranks = setup.mesh["data"].size()
            setup.notes.append(f"zero: stage {settings.stage} over {ranks} data ranks")
        elif settings.stage == 1:
            # Here, not at the top: torch.distributed.optim scripts its functional
            # optimizers at import, 6-8% of the rank server's imports, which a bench of a
            # plan without ZeRO-1 need not wait for (harness tune preloads it).
            from torch.distributed.optim import ZeroRedundancyOptimizer

            pg = group(setup.mesh, "data", "zero")
            setup.optimizer_wrapper = lambda params, make: ZeroRedundancyOptimizer(
                params, optimizer_class=make, process_group=pg
            )


def offload_threads(cores: int, local_ranks: int) -> int:
    """Threads for one rank's CPU optimizer step under offload: its share of the node's
    cores. torchrun (and our one-node launcher) set OMP_NUM_THREADS=1 for several ranks
    so that GPU ranks' host threads do not fight; an offloaded AdamW over every
    parameter on one thread would then be the step's bottleneck."""
    return max(1, cores // max(1, local_ranks))


def shard(setup, settings: ZeroSettings) -> None:
    """fully_shard every block (training_harness.workloads.blocks: `blocks`, or HF's decoder
    layers ...), then each root (the model, or each pipeline stage)."""
    mesh = submesh(setup.mesh, "data", "zero")
    amp = setup.plan.strategies.get("amp") if setup.plan is not None else None
    mp = MixedPrecisionPolicy()
    if amp is not None and settings.mixed_precision:
        mp = MixedPrecisionPolicy(
            param_dtype=AMP_DTYPES[amp.get("dtype", "bf16")], reduce_dtype=torch.float32
        )
    offload = OffloadPolicy()
    if settings.offload:
        offload = CPUOffloadPolicy(pin_memory=setup.device.type == "cuda")
        if setup.device.type == "cpu":
            setup.notes.append("zero: offload on the CPU moves nothing (already there)")
        else:
            threads = offload_threads(len(cpus()), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            torch.set_num_threads(threads)
            setup.notes.append(f"zero: offload steps the optimizer on the CPU with {threads} "
                               "threads (this rank's share of the node's cores)")
    kwargs = dict(mesh=mesh, reshard_after_forward=settings.stage == 3, mp_policy=mp,
                  offload_policy=offload)
    stages = local_stages(setup.model)
    roots: list[nn.Module] = list(stages) if stages is not None else [setup.model]
    for root in roots:
        for block in find_blocks(root) or []:
            fully_shard(block, **kwargs)
        fully_shard(root, **kwargs)

    @contextlib.contextmanager
    def no_sync():
        for root in roots:
            root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for root in roots:
                root.set_requires_gradient_sync(True)

    setup.no_sync = no_sync


register(Zero())
