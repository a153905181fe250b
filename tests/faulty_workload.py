"""A tiny GPT that fails on purpose, on one rank, for the launcher's tests.

    workload = "tests.faulty_workload:build"    # with fail_rank=1, hang_rank=..., ...

- `fail_rank`: the loss raises RuntimeError on that rank (at `fail_at_step`);
- `hang_rank`: the loss sleeps for ever on that rank (first touching the file
  rank<r> in the folder HANG_MARK_ENV names, when set: the rank is in its hang);
- `oom_rank`: the loss raises torch.OutOfMemoryError, as CUDA does, on that rank;
- `nan_at_step`: the loss is NaN on `nan_rank` (every rank when -1) from that step;
- `exit_rank`: the process ends at once (os._exit(3)) on that rank, with no error;
- `flood_mb`, `flood_stderr_mb`: at the first training step, before any other
  fault, `flood_rank` (every rank when -1) writes that many MB (10**6 bytes) of
  lines to its stdout and its stderr, in 1 MiB blocks (spread over `flood_s`
  seconds, or as fast as it can), then one line on each, "flood done: ...".

Steps count training calls of the loss (one per optimizer step without
accumulation); FLOP counting on the meta device does not count and never fails.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from training_harness.workloads.base import Workload
from training_harness.workloads.gpt import build_gpt

HANG_MARK_ENV = "FAULTY_HANG_MARK"


class Faulty(Workload):
    name = "faulty-gpt"

    def __init__(self, inner: Workload, faults: dict[str, float]) -> None:
        self.inner = inner
        self.faults = faults
        self.tokens_per_sample = inner.tokens_per_sample
        self.shape = inner.shape
        self.calls = 0

    def build_model(self):
        return self.inner.build_model()

    def batch(self, batch_size: int, index: int, device):
        return self.inner.batch(batch_size, index, device)

    def flops_per_sample(self) -> float:
        return self.inner.flops_per_sample()

    def loss(self, model, batch: Any) -> torch.Tensor:
        if any(t.device.type == "meta" for t in tree_leaves(batch) if torch.is_tensor(t)):
            return self.inner.loss(model, batch)
        step, self.calls = self.calls, self.calls + 1
        rank, f = int(os.environ.get("RANK", "0")), self.faults
        if step == 0 and (f["flood_mb"] or f["flood_stderr_mb"]) and f["flood_rank"] in (-1, rank):
            flood(rank, f["flood_mb"], f["flood_stderr_mb"], f["flood_s"])
        if rank == f["fail_rank"] and step >= f["fail_at_step"]:
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if rank == f["oom_rank"]:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)"
            )
        if rank == f["exit_rank"]:
            os._exit(3)
        if rank == f["hang_rank"]:
            if os.environ.get(HANG_MARK_ENV):
                (Path(os.environ[HANG_MARK_ENV]) / f"rank{rank}").touch()
            while True:
                time.sleep(3600)
        loss = self.inner.loss(model, batch)
        if 0 <= f["nan_at_step"] <= step and f["nan_rank"] in (-1, rank):
            loss = loss * float("nan")
        return loss


def flood(rank: int, stdout_mb: float, stderr_mb: float, seconds: float) -> None:
    fill = (b"." * 99 + b"\n") * (2**20 // 100)
    pause = seconds * 2**20 / max(1.0, (stdout_mb + stderr_mb) * 10**6)  # per block
    for stream, mb in ((sys.stdout, stdout_mb), (sys.stderr, stderr_mb)):
        size, block = int(mb * 10**6), 0
        while size > 0:
            data = (f"flood rank {rank} block {block}\n".encode() + fill)[:size]
            stream.buffer.write(data[:-1] + b"\n")  # whole lines, the last one too
            stream.flush()
            size, block = size - len(data), block + 1
            time.sleep(pause)
    for stream in (sys.stdout, sys.stderr):
        print(f"flood done: {stdout_mb:g} MB to stdout, {stderr_mb:g} MB to stderr on rank "
              f"{rank}", file=stream, flush=True)


def build(
    fail_rank: int = -1,
    fail_at_step: int = 0,
    hang_rank: int = -1,
    oom_rank: int = -1,
    nan_at_step: int = -1,
    nan_rank: int = -1,
    exit_rank: int = -1,
    flood_mb: float = 0,
    flood_stderr_mb: float = 0,
    flood_rank: int = -1,
    flood_s: float = 0,
    **gpt_args: Any,
) -> Workload:
    faults = dict(fail_rank=fail_rank, fail_at_step=fail_at_step, hang_rank=hang_rank,
                  oom_rank=oom_rank, nan_at_step=nan_at_step, nan_rank=nan_rank,
                  exit_rank=exit_rank, flood_mb=flood_mb, flood_stderr_mb=flood_stderr_mb,
                  flood_rank=flood_rank, flood_s=flood_s)
    return Faulty(build_gpt(**gpt_args), faults)

