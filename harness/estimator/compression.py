"""DDP's gradient compression: the bytes its all-reduce sends per step, and what PowerSGD
keeps between steps.

    none        every trainable gradient, at its width
    fp16, bf16  the same elements, 2 bytes each
    powersgd    torch's powerSGD_hook (strategies.ddp) after its warm-up: a gradient viewed
                as a matrix n x m (its first dimension by the rest) goes as P (n x r') and
                Q (m x r'), r' = min(n, m, rank), when (n + m) r' x 2 < n m (torch's
                min_compression_rate, 2); 1-D tensors and small matrices go whole

The estimate is of the steady step, after PowerSGD's warm-up: its first
start_powersgd_iter steps all-reduce the whole gradients, as plain DDP does.

What PowerSGD keeps (error feedback and warm start, torch's defaults, on): per bucket, an
error-feedback tensor the bucket's size (all the gradients, together) and its P and Q
(the factors' elements above); in the hook, a copy of the bucket being compressed and the
new error tensor before the old one is freed.
"""

from __future__ import annotations

import math

from training_harness.estimator.facts import Param
from training_harness.estimator.settings import Parallelism

MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


def powersgd_elements(shape: tuple[int, ...], rank: int) -> tuple[int, bool]:
    """(elements all-reduced, compressed?) for one gradient of `shape`, as torch's
    powerSGD_hook decides it (`tensor.view(shape[0], -1)`, then its 2x test)."""
    numel = math.prod(shape)
    if len(shape) < 2:
        return numel, False
    n = shape[0]
    m = numel // n
    r = min(n, m, rank)
    if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
        return (n + m) * r, True
    return numel, False


def wire_bytes(params: list[Param], par: Parallelism) -> int:
    """The trainable gradients' bytes DDP's all-reduce sends per step (once; the ring's
    2 (d-1)/d is the step time's)."""
    train = [p for p in params if p.trainable]
    if par.compression in ("fp16", "bf16"):
        return 2 * sum(p.numel for p in train)
    if par.compression == "powersgd":
        return sum(p.width * powersgd_elements(p.shape, par.powersgd_rank)[0] for p in train)
    return sum(p.bytes for p in train)


def powersgd_kept(params: list[Param], par: Parallelism) -> int:
    """PowerSGD's state between steps: the error-feedback tensors (every trainable
    gradient's size) and the P and Q factors of the compressed ones."""
    train = [p for p in params if p.trainable]
    factors = sum(p.width * n for p in train
                  for n, packed in [powersgd_elements(p.shape, par.powersgd_rank)] if packed)
    return sum(p.bytes for p in train) + factors
