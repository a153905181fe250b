"""The validation loss, measured honestly: held-out data, eval mode, no gradients.

Always over the same held-out samples (the workload's `eval_batch` 0, 1, ... of a
fixed size), so two losses of one run, or of two runs, are over the same data. It
runs in the step's precision (the autocast the strategies set): the precision is
part of the model being judged. Training mode is restored afterwards.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from training_harness.workloads import Workload

MAX_EVAL_BATCH = 64


def eval_batch_size(samples: int) -> int:
    """The largest size up to MAX_EVAL_BATCH that divides `samples`: every batch full."""
    return max(b for b in range(1, min(MAX_EVAL_BATCH, samples) + 1) if samples % b == 0)


@torch.no_grad()
def validation_loss(model: nn.Module, workload: Workload, samples: int,
                    device: torch.device | str,
                    autocast: contextlib.AbstractContextManager | None = None) -> float:
    """The mean loss over the first `samples` held-out samples."""
    was_training = model.training
    model.eval()
    size = eval_batch_size(samples)
    total = 0.0
    try:
        for i in range(samples // size):
            batch = workload.eval_batch(size, i, device)
            with autocast or contextlib.nullcontext():
                loss = workload.loss(model, batch)
            total += float(loss.float())
    finally:
        model.train(was_training)
    value = total / (samples // size)
    return value if math.isfinite(value) else math.inf
