"""A tiny GPT and a plain training loop through `compose`, shared by strategy tests."""

from __future__ import annotations

import torch

from training_harness.core.plan import Plan
from training_harness.measure.batches import split_batch
from training_harness.strategies.compose import compose
from training_harness.workloads import load_workload

TINY_GPT = dict(layers=2, heads=2, hidden=32, seq_len=16, vocab=64)


def tiny_gpt(**overrides):
    return load_workload("gpt", {**TINY_GPT, **overrides})


def train(strategies: dict, micro: int = 8, global_batch: int = 8, steps: int = 5,
          lr: float = 1e-2, workload=None, device: str = "cpu") -> list[float]:
    """Losses of `steps` optimizer steps from the same seed and data, on `device`."""
    workload = workload or tiny_gpt()
    torch.manual_seed(0)
    with torch.device(device):
        model = workload.build_model()
    plan = Plan(micro_batch_size=micro, global_batch_size=global_batch,
                strategies=strategies, device=device)
    plan.optimizer.lr = lr
    setup = compose(model, plan, device)
    losses = []
    for s in range(steps):
        batch = workload.batch(global_batch, s, device)
        losses.append(setup.step(split_batch(batch, plan.accumulation_steps), workload.loss).item())
    return losses
