"""A tiny GPT whose first averaged gradients are saved: a trial on two nodes compared
with the same trial on one.

    [workload]
    name = "tests.slurm.grads_workload:build"
    grads_dir = "/tmp/x/grads"   # rank<r>.pt: {parameter name: its gradient}

The gradients saved are those of the first backward as DDP's all-reduce left them
(averaged over the ranks, what every rank's optimizer steps with): a communication hook
runs the default all-reduce and copies its result. Without DDP (one rank) nothing is saved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves

from training_harness.workloads.base import Workload
from training_harness.workloads.gpt import build_gpt


def build(grads_dir: str, **gpt_args: Any) -> Workload:
    workload = build_gpt(**gpt_args)
    loss, hooked = workload.loss, []

    def hooked_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        real = not any(t.device.type == "meta" for t in tree_leaves(batch) if torch.is_tensor(t))
        if real and not hooked and isinstance(model, DistributedDataParallel):
            hooked.append(True)  # before this step's backward: its gradients are the first
            model.register_comm_hook(None, _saving(Path(grads_dir), model.module))
        return loss(model, batch)

    workload.loss = hooked_loss  # type: ignore[method-assign]
    return workload


def _saving(folder: Path, module: torch.nn.Module) -> Any:
    names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
    saved: dict[str, torch.Tensor] = {}
    path = folder / f"rank{dist.get_rank()}.pt"

    def hook(state, bucket):  # noqa: ANN001 (DDP refuses a bucket annotated as a string)
        params = list(bucket.parameters())

        def keep(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            averaged = fut.value()
            if len(saved) < len(names):  # the first backward only
                offset = 0
                for p in params:  # the bucket's buffer: its gradients end to end
                    saved[names[id(p)]] = averaged[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
                if len(saved) == len(names):
                    folder.mkdir(parents=True, exist_ok=True)
                    torch.save(saved, path)
            return averaged

        return default_hooks.allreduce_hook(state, bucket).then(keep)

    return hook
