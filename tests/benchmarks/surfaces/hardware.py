"""The H100 SXM5 80GB and its node, as the surfaces assume them (h100.py's docstring
gives each figure's source). The figures a family of surfaces varies are fields of
assumptions.Assumptions (whose defaults are the ones below); the functions take one."""

from __future__ import annotations

from tests.benchmarks.surfaces.assumptions import BASE, Assumptions

GIB = 2**30

PEAK = {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12}  # dense
HBM_BW = 3.35e12  # bytes/s
HBM_EFF = 0.80  # of HBM_BW, for streaming element-wise kernels
CAPACITY = int(79.18 * GIB)  # what torch reports for an "80GB" H100
CONTEXT = int(0.75 * GIB)  # CUDA context + cuBLAS/cuDNN workspaces held beside tensors
COMPILED_EXTRA = int(0.25 * GIB)  # Inductor/Triton modules and their workspaces
NCCL_BUFFERS = int(0.5 * GIB)  # NCCL channels' buffers, once a rank has a peer

BUSBW = 360e9  # NCCL bus bandwidth over NVLink 4 / NVSwitch for large messages
HALF_BW_BYTES = 2e6  # message size at which a collective gets half of BUSBW
COLLECTIVE_LATENCY = 20e-6  # seconds per collective
P2P_BW = 400e9  # one direction, GPU to GPU over NVLink 4
P2P_LATENCY = 30e-6

# CPU-side cost of issuing work (PyTorch eager dispatch, autograd engine, Inductor's wrapper)
EAGER_FWD_OP = 12e-6
EAGER_BWD_OP = 6e-6
COMPILED_LAUNCH = 5e-6
COMPILED_CALL = 40e-6  # Python wrapper + guards per compiled graph call


def collective(nbytes: float, ranks: int, kind: str, a: Assumptions = BASE) -> float:
    """Seconds for one NCCL collective of `nbytes` (the full buffer) over `ranks` GPUs:
    all-reduce moves 2(n-1)/n of it per rank, all-gather and reduce-scatter (n-1)/n."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    factor = (2.0 if kind == "all_reduce" else 1.0) * (ranks - 1) / ranks
    bw = a.busbw * nbytes / (nbytes + a.half_bw_bytes)
    return a.collective_latency + factor * nbytes / bw


def gemm_efficiency(dtype: str, tokens: float, width: float, a: Assumptions = BASE) -> float:
    """The share of the dense datasheet peak a training GEMM reaches: tensor cores
    (bf16/fp16) want a large M (tokens per micro-batch) and a wide N/K (`width`: the
    hidden size, divided by the tensor-parallel degree); fp32 runs on the CUDA cores
    and saturates early."""
    if dtype == "fp32":
        return a.gemm_top32 * width / (width + a.gemm_width32) * tokens / (
            tokens + a.gemm_tokens32)
    return a.gemm_top16 * width / (width + a.gemm_width16) * tokens / (tokens + a.gemm_tokens16)
