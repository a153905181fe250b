"""Feeding a trial: the global batch of each step, this rank's share, its micro-batches."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from training_harness.core.plan import Plan
from training_harness.workloads import Workload

# Distinct step batches kept on the device and cycled: making data stays out of
# the timed steps, and the memory the batches take stays bounded.
POOL_SIZE = 8


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split every tensor of `batch` into `parts` equal micro-batches along dim 0."""
    return [
        tree_map(lambda t, i=i: t.chunk(parts)[i] if torch.is_tensor(t) else t, batch)
        for i in range(parts)
    ]


def rank_share(batch: Any, rank: int, ranks: int) -> Any:
    """Rank `rank`'s contiguous 1/`ranks` of every tensor in `batch`."""
    return tree_map(lambda t: t.chunk(ranks)[rank] if torch.is_tensor(t) else t, batch)


def step_pool(
    plan: Plan, workload: Workload, device: torch.device, data_rank: int = 0
) -> list[list[Any]]:
    """Micro-batches of each pooled step, on `device`.

    The global batch of step s is the same whatever the micro-batch size or the
    number of data-parallel ranks, so techniques are compared on equal data.
    """
    pool = []
    for s in range(min(POOL_SIZE, plan.warmup_steps + plan.steps)):
        mine = rank_share(workload.batch(plan.batch_size, s, "cpu"), data_rank, plan.layout.data)
        mine = tree_map(lambda t: t.to(device) if torch.is_tensor(t) else t, mine)
        pool.append(split_batch(mine, plan.accumulation_steps))
    return pool
