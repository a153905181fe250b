"""What a CUDA process holds on its device beyond its tensors, measured once per device.

Three terms, measured in the calibration process (training_harness.measure.calibrate
--overhead; never in the tuner's helper, which must hold no CUDA context) and cached
in $HARNESS_CACHE_DIR/overhead.json per GPU, driver-visible identity and torch:

- `context_bytes`: the CUDA context (its code modules and runtime heaps), what the
  process holds right after its first tensor;
- `workspace_bytes`: what the first bf16 and fp32 matmuls and an SDPA forward and
  backward add and keep once their tensors are freed (cuBLAS/cuBLASLt workspaces,
  lazily loaded kernels, attention's scratch);
- `nccl_bytes_per_communicator`: what a one-rank NCCL communicator adds after its
  first all-reduce. A communicator with peers holds more (buffers per peer and
  channel, NCCL_BUFFSIZE 4 MiB each by default): the figure is a floor, and the
  estimator says so.

The estimator adds these to a CUDA plan's peak (training_harness.estimator.estimate), so the
raw prediction is of what the device holds for the trial, as NVML reports it. On a
CPU the terms are zero.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from dataclasses import asdict
from typing import Any

import torch

from training_harness.core.overhead import DeviceOverhead

OVERHEAD_FILE = "overhead.json"
CALIBRATION_TIMEOUT_S = 300.0


def device_overhead(device: torch.device) -> DeviceOverhead:
    """The cached figures of `device`'s GPU, measured in the calibration process on a miss;
    zeros on a CPU. A measurement that fails is not cached: the terms are then zero and
    `source` says why, so the estimate names what it did not count."""
    if device.type != "cuda":
        return DeviceOverhead.none(device.type)
    from training_harness.measure import cache as store
    from training_harness.measure.nvml import gpu_identity

    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (f"{torch.cuda.get_device_name(device)}|{gpu_identity(device)}|torch {torch.__version__}"
           f"|cuda {torch.version.cuda}")
    hit = DeviceOverhead.from_record(store.read(OVERHEAD_FILE).get(key))
    if hit is not None:
        return hit
    try:
        measured = _measure_in_subprocess(device)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as e:
        return DeviceOverhead(0, 0, 0, f"not measured ({e}); the context is not counted")
    store.add(OVERHEAD_FILE, {key: asdict(measured)})
    return measured


def _measure_in_subprocess(device: torch.device) -> DeviceOverhead:
    from training_harness.measure.peaks import run_module

    line = run_module("training_harness.measure.calibrate", ["--overhead", str(device)],
                      CALIBRATION_TIMEOUT_S, "the calibration process")
    found = DeviceOverhead.from_record(json.loads(line))
    if found is None:
        raise ValueError("the calibration process gave no overhead figures")
    return found


def measure(device: torch.device) -> DeviceOverhead:
    """In the calibration process: the three terms on `device` (a CUDA one), each the
    growth of what the device holds for this process: NVML's per-process figure, or,
    where NVML has none (containers), the device's used memory less what it held before
    this process made its context."""
    if device.type != "cuda":
        return DeviceOverhead.none(device.type)
    from training_harness.measure.nvml import process_memory_bytes

    before = _device_used(device)  # read before the context exists
    torch.ones(1, device=device)
    per_process = process_memory_bytes(device) is not None

    def held() -> int:
        torch.cuda.synchronize(device)
        mine = process_memory_bytes(device) if per_process else None
        if mine is not None:
            return int(mine)
        free, total = torch.cuda.mem_get_info(device)
        return int(total) - int(free) - (before or 0)

    context = held()
    _first_kernels(device)
    torch.cuda.empty_cache()  # what stays is not cache: workspaces and loaded kernels
    workspace = max(0, held() - context)
    nccl = _one_rank_communicator(device, lambda: held() - context - workspace)
    how = ("NVML, this process" if per_process else
           "device used memory less what it held before" if before is not None else
           "device used memory (other processes' memory counted too)")
    source = f"measured once on {torch.cuda.get_device_name(device)} ({how}), cached"
    return DeviceOverhead(max(0, context), workspace, max(0, nccl), source)


def _device_used(device: torch.device) -> int | None:
    """What the whole device holds now (NVML; None without it)."""
    from training_harness.measure.nvml import ask_device

    return ask_device(device, lambda nv, handle: int(nv.nvmlDeviceGetMemoryInfo(handle).used))


def _first_kernels(device: torch.device) -> None:
    import torch.nn.functional as F

    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(1024, 1024, device=device, dtype=dtype)
        (a @ a).sum().item()
    q = torch.randn(2, 8, 256, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    del a, q


def _one_rank_communicator(device: torch.device, grown: Any) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        return 0
    with contextlib.suppress(Exception):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)
        try:
            t = torch.ones(1 << 20, device=device)
            dist.all_reduce(t)
            del t
            torch.cuda.empty_cache()
            return int(grown())
        finally:
            dist.destroy_process_group()
    return 0
