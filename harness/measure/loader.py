"""Feeding a trial's steps: the synthetic pool, or real data through a DataLoader whose
waits are measured, not hidden.

Each item of the loader is one optimizer step's share of this rank (the workload's
batch `step`, cut as training_harness.measure.batches cuts the synthetic pool), made by worker
processes ahead of the step and, on CUDA, in pinned memory so the copy is
asynchronous. The time the step waits in `next()` for a batch is the data's cost:
it falls inside the timed window, as it does in training, and the record says how
much of the window it was (metrics.data_wait_s, metrics.data_wait_share).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, Dataset

from training_harness.core.plan import Plan
from training_harness.core.window import MAX_WINDOW_STEPS, window_rule
from training_harness.measure.batches import rank_share, split_batch, step_pool
from training_harness.workloads import Workload

PREFETCH = 4  # batches each worker keeps ready


def loader_workers(device: torch.device, local_ranks: int = 1) -> int:
    """Worker processes per rank: one on the CPU, where the cores train the model too;
    up to four on CUDA, a share of the host's cores."""
    if device.type != "cuda":
        return 1
    return max(1, min(4, (os.cpu_count() or 2) // (2 * max(1, local_ranks))))


class StepShares(Dataset):
    """Item s: this data-parallel rank's share of the global batch of step s."""

    def __init__(self, workload: Workload, batch_size: int, steps: int, data_rank: int,
                 data_ranks: int) -> None:
        self.workload, self.batch_size, self.steps = workload, batch_size, steps
        self.data_rank, self.data_ranks = data_rank, data_ranks

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> Any:
        batch = self.workload.batch(self.batch_size, step, "cpu")
        return rank_share(batch, self.data_rank, self.data_ranks)


class LoaderFeed:
    """`feed(i)`: the micro-batches of step i, in order, on the device; `waits_s[i]`: how
    long step i waited for them."""

    def __init__(self, plan: Plan, workload: Workload, device: torch.device, data_rank: int,
                 steps: int, local_ranks: int = 1) -> None:
        self.plan, self.device = plan, device
        self.pin = device.type == "cuda"
        self.workers = loader_workers(device, local_ranks)
        shares = StepShares(workload, plan.batch_size, steps, data_rank, plan.layout.data)
        self.loader = DataLoader(shares, batch_size=None, shuffle=False,
                                 num_workers=self.workers, pin_memory=self.pin,
                                 prefetch_factor=PREFETCH if self.workers else None)
        self._batches = iter(self.loader)
        self.waits_s: list[float] = []
        self.source = workload.data

    def __call__(self, step: int) -> list[Any]:
        if step != len(self.waits_s):
            raise RuntimeError(f"the loader feeds steps in order: asked {step}, "
                               f"next is {len(self.waits_s)}")
        t0 = time.perf_counter()
        batch = next(self._batches)
        self.waits_s.append(time.perf_counter() - t0)
        batch = tree_map(lambda t: t.to(self.device, non_blocking=self.pin)
                         if torch.is_tensor(t) else t, batch)
        return split_batch(batch, self.plan.accumulation_steps)

    def record(self, first: int, window_s: float | None) -> dict[str, Any]:
        """The wait of the measured steps (from step `first` on) against the window."""
        self._batches = iter(())  # ends the workers
        waited = self.waits_s[first:]
        total = sum(waited)
        return {"source": self.source, "loader": "dataloader", "workers": self.workers,
                "pin_memory": self.pin, "prefetch": PREFETCH, "data_wait_s": total,
                "data_wait_share": total / window_s if window_s else None,
                "data_wait_median_s": statistics.median(waited) if waited else None}


class PoolFeed:
    """`feed(i)`: the pooled step i % POOL_SIZE. Its batches were made before the timed
    window, so no step waits for data."""

    def __init__(self, pool: list[list[Any]], source: str) -> None:
        self.pool, self.source = pool, source

    def __call__(self, step: int) -> list[Any]:
        return self.pool[step % len(self.pool)]

    def record(self, first: int, window_s: float | None) -> dict[str, Any]:
        return {"source": self.source, "loader": "pool", "pool_size": len(self.pool),
                "data_wait_s": 0.0, "data_wait_share": 0.0}


def step_feed(plan: Plan, workload: Workload, device: torch.device, data_rank: int = 0,
              local_ranks: int = 1) -> Any:
    """Synthetic data: the pool (made here, outside the timed steps). Real data: a
    DataLoader feeding each step in turn, its waits measured (training_harness.measure.loader)."""
    if workload.data == "synthetic":
        return PoolFeed(step_pool(plan, workload, device, data_rank), workload.data)
    return LoaderFeed(plan, workload, device, data_rank, trial_steps_max(plan, device.type),
                      local_ranks)


def trial_steps_max(plan: Plan, device_type: str) -> int:
    """The most steps a trial runs: warm-up's cap and the longest window
    (training_harness.core.window.window_rule)."""
    cap, min_s = window_rule(plan.warmup_steps, plan.steps, plan.warmup_max_steps,
                             plan.min_window_s, device_type)
    return cap + (max(plan.steps, MAX_WINDOW_STEPS) if min_s else plan.steps)


def feed_capacity(feed: Any) -> int:
    """How many steps `feed` can serve: a loader's length; the pool cycles."""
    return len(feed.loader.dataset) if isinstance(feed, LoaderFeed) else 10**9
