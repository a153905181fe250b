"""GPU datasheets: the one table of the harness, by torch's device name and by target name.

Each row is a GPU as its vendor publishes it: the dense peak FLOP/s of each matmul dtype
(MFU's denominator: training_harness.measure.peaks), and where known its memory, the memory's
bandwidth, the link between the GPUs of one node and the usual network per GPU between
nodes (the estimator's step time: training_harness.estimator.bandwidth). Rows with a `target`
name hold the whole sheet, so that `harness estimate --target` and `harness plan` can
predict for that GPU without having one (training_harness.estimator.target).

Rows are tried in order and the first match wins: specific variants come before the
generic name of their family, and patterns use word boundaries so that "GH200" is not
"H200", "A100" is not "A10", "L40S" is not "L40" or "L4". Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GiB = 1024**3


@dataclass(frozen=True)
class Gpu:
    """One GPU's datasheet."""

    label: str  # "NVIDIA H100 SXM"
    pattern: re.Pattern[str]  # the names torch gives it
    # Dense peaks by dtype (half the "with sparsity" figures of the sheets): fp32 the
    # plain FMA rate (AMD: the matrix cores', which rocBLAS uses); tf32/bf16/fp16
    # tensor-core rates with fp32 accumulation (what PyTorch's matmuls use); fp8 the
    # float8 tensor rate (float8 training). A dtype the GPU lacks is left out.
    flops: dict[str, float]
    note: str = ""
    # --- the rest of the sheet, for the rows a target can name ---
    target: str | None = None  # "h100-sxm-80gb": the --target name
    torch_name: str = ""  # what torch.cuda.get_device_name says for it
    memory_bytes: int | None = None  # what a process may use (torch's total_memory)
    memory_source: str = "datasheet"  # "datasheet", or where the figure was measured
    memory_bandwidth: float | None = None  # bytes/s of its memory
    link: float | None = None  # bytes/s per direction to another GPU of its node
    link_kind: str = ""  # "NVLink 4", "PCIe Gen5 x16"
    network: float | None = None  # bytes/s per GPU per direction between nodes (usual)
    gpus_per_node: int = 8  # of the usual server
    extra: dict[str, str] = field(default_factory=dict)  # the memory kind, and such


def _gpu(label: str, pattern: str, note: str = "", **kw) -> Gpu:
    flops = {k: kw.pop(k) for k in ("fp32", "tf32", "bf16", "fp16", "fp8") if k in kw}
    return Gpu(label, re.compile(pattern, re.IGNORECASE), flops, note, **kw)


_HOPPER_SXM = {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12,
               "fp8": 1978.9e12}
_HOPPER_NVL = {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12,
               "fp8": 1670.5e12}
_A100 = {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}
# Hopper and Ampere NVLink: 900 / 600 GB/s both directions together, per GPU.
_NVLINK4, _NVLINK3 = 450e9, 300e9
_PCIE5, _PCIE4 = 64e9, 32e9  # x16, one direction
# The usual network of such a server: one 400 Gb/s NIC per GPU (NDR), 200 Gb/s (HDR)
# on A100 servers, 100-200 Gb/s on PCIe cards' hosts: a typical figure, not a rule.
_NDR, _HDR, _ETH = 50e9, 25e9, 12.5e9

GPUS: tuple[Gpu, ...] = (
    # NVIDIA Blackwell
    _gpu("NVIDIA GB200", r"\bGB200\b", fp32=80e12, tf32=1.25e15, bf16=2.5e15, fp16=2.5e15,
         fp8=5e15),
    _gpu("NVIDIA B200", r"\bB200\b", "HGX B200 at 1000 W", fp32=75e12, tf32=1.1e15,
         bf16=2.25e15, fp16=2.25e15, fp8=4.5e15),
    # NVIDIA Hopper
    _gpu("NVIDIA GH200", r"\bGH200\b", **_HOPPER_SXM),
    _gpu("NVIDIA H200 NVL", r"\bH200\b.*\bNVL\b", **_HOPPER_NVL),
    _gpu("NVIDIA H200 SXM", r"\bH200\b(?!.*\bNVL\b)", **_HOPPER_SXM, target="h200-sxm-141gb",
         torch_name="NVIDIA H200", memory_bytes=int(139.8 * GiB), memory_bandwidth=4.8e12,
         link=_NVLINK4, link_kind="NVLink 4", network=_NDR, extra={"memory": "HBM3e"}),
    _gpu("NVIDIA H100 PCIe", r"\bH100\b.*\bPCIe\b", fp32=51.2e12, tf32=378e12, bf16=756.5e12,
         fp16=756.5e12, fp8=1513e12, target="h100-pcie-80gb", torch_name="NVIDIA H100 PCIe",
         memory_bytes=int(79.18 * GiB), memory_bandwidth=2.0e12, link=_PCIE5,
         link_kind="PCIe Gen5 x16 (no NVLink bridge)", network=_HDR, extra={"memory": "HBM2e"}),
    _gpu("NVIDIA H100 NVL", r"\bH100\b.*\bNVL\b", **_HOPPER_NVL, target="h100-nvl-94gb",
         torch_name="NVIDIA H100 NVL", memory_bytes=int(93.1 * GiB), memory_bandwidth=3.9e12,
         link=300e9, link_kind="NVLink bridge (pairs)", network=_NDR, extra={"memory": "HBM3"}),
    # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 ...", plain "NVIDIA H100"
    _gpu("NVIDIA H100 SXM", r"\bH100\b(?!.*\b(?:PCIe|NVL)\b)", **_HOPPER_SXM,
         target="h100-sxm-80gb", torch_name="NVIDIA H100 80GB HBM3",
         memory_bytes=int(79.18 * GiB),
         memory_source="measured: docs/benchmarks/gpu_h100-80gb-hbm3_2026-11-23.md",
         memory_bandwidth=3.35e12, link=_NVLINK4, link_kind="NVLink 4", network=_NDR,
         extra={"memory": "HBM3"}),
    # NVIDIA Ampere
    _gpu("NVIDIA A100 PCIe 40GB", r"\bA100\b(?=.*\bPCIe\b)(?=.*\b40GB\b)", **_A100,
         memory_bandwidth=1.555e12, link=_PCIE4, link_kind="PCIe Gen4 x16"),
    _gpu("NVIDIA A100 PCIe", r"\bA100\b.*\bPCIe\b", **_A100, torch_name="NVIDIA A100 80GB PCIe",
         memory_bytes=int(79.15 * GiB), memory_bandwidth=1.935e12, link=_PCIE4,
         link_kind="PCIe Gen4 x16", network=_HDR, target="a100-pcie-80gb",
         extra={"memory": "HBM2e"}),
    _gpu("NVIDIA A100 SXM 40GB", r"\bA100\b.*\b40GB\b", **_A100, target="a100-sxm-40gb",
         torch_name="NVIDIA A100-SXM4-40GB", memory_bytes=int(39.39 * GiB),
         memory_bandwidth=1.555e12, link=_NVLINK3, link_kind="NVLink 3", network=_HDR,
         extra={"memory": "HBM2"}),
    _gpu("NVIDIA A100 SXM", r"\bA100\b(?!.*\bPCIe\b)", **_A100, target="a100-sxm-80gb",
         torch_name="NVIDIA A100-SXM4-80GB", memory_bytes=int(79.15 * GiB),
         memory_bandwidth=2.039e12, link=_NVLINK3, link_kind="NVLink 3", network=_HDR,
         extra={"memory": "HBM2e"}),
    _gpu("NVIDIA A10G", r"\bA10G\b",
         "AWS variant; NVIDIA publishes no sheet, figures from its clocks and AWS",
         fp32=35e12, tf32=35e12, bf16=70e12, fp16=70e12, target="a10g-24gb",
         torch_name="NVIDIA A10G", memory_bytes=int(22.0 * GiB), memory_bandwidth=0.6e12,
         link=_PCIE4, link_kind="PCIe Gen4 x16", network=_ETH, extra={"memory": "GDDR6"}),
    _gpu("NVIDIA A10", r"\bA10\b", fp32=31.2e12, tf32=62.5e12, bf16=125e12, fp16=125e12),
    _gpu("NVIDIA GeForce RTX 3090 Ti", r"\bRTX 3090 Ti\b", fp32=40e12, tf32=40e12, bf16=80e12,
         fp16=80e12),
    _gpu("NVIDIA GeForce RTX 3090", r"\bRTX 3090\b(?!\s*Ti\b)", fp32=35.6e12, tf32=35.6e12,
         bf16=71e12, fp16=71e12),
    # NVIDIA Ada
    _gpu("NVIDIA L40S", r"\bL40S\b", fp32=91.6e12, tf32=183e12, bf16=362.05e12,
         fp16=362.05e12, fp8=733e12, target="l40s-48gb", torch_name="NVIDIA L40S",
         memory_bytes=int(44.4 * GiB), memory_bandwidth=0.864e12, link=_PCIE4,
         link_kind="PCIe Gen4 x16 (no NVLink)", network=_ETH, extra={"memory": "GDDR6"}),
    _gpu("NVIDIA L40", r"\bL40\b", fp32=90.5e12, tf32=90.5e12, bf16=181.05e12, fp16=181.05e12,
         memory_bandwidth=0.864e12, link=_PCIE4, link_kind="PCIe Gen4 x16"),
    _gpu("NVIDIA L4", r"\bL4\b", fp32=30.3e12, tf32=60e12, bf16=121e12, fp16=121e12,
         memory_bandwidth=0.3e12, link=_PCIE4, link_kind="PCIe Gen4 x16"),
    _gpu("NVIDIA GeForce RTX 4090", r"\bRTX 4090\b(?!\s*(?:D\b|Laptop))", fp32=82.6e12,
         tf32=82.6e12, bf16=165.2e12, fp16=165.2e12, fp8=330.3e12, target="rtx4090-24gb",
         torch_name="NVIDIA GeForce RTX 4090", memory_bytes=int(23.6 * GiB),
         memory_bandwidth=1.008e12, link=_PCIE4,
         link_kind="PCIe Gen4 x16 (no NVLink; peer access through the host)", network=_ETH,
         gpus_per_node=4, extra={"memory": "GDDR6X"}),
    # NVIDIA Volta / Turing: no bf16 or tf32 tensor cores
    _gpu("NVIDIA V100S PCIe", r"\bV100S\b", fp32=16.4e12, fp16=130e12),
    _gpu("NVIDIA V100 SXM2", r"\bV100\b.*\bSXM", fp32=15.7e12, fp16=125e12),
    _gpu("NVIDIA V100 PCIe", r"\bV100\b.*\bPCIe\b", fp32=14e12, fp16=112e12),
    _gpu("NVIDIA T4", r"\bT4\b", fp32=8.1e12, fp16=65e12),
    # AMD Instinct (ROCm's torch calls its devices "cuda", so the estimator's CUDA model
    # applies; the figures are AMD's, the overheads assumed like NVIDIA's)
    _gpu("AMD MI300X", r"\bMI300X\b", fp32=163.4e12, tf32=653.7e12, bf16=1307.4e12,
         fp16=1307.4e12, fp8=2614.9e12, target="mi300x-192gb",
         torch_name="AMD Instinct MI300X", memory_bytes=int(191.98 * GiB),
         memory_bandwidth=5.3e12, link=448e9, link_kind="Infinity Fabric (7 links x 64 GB/s)",
         network=_NDR, extra={"memory": "HBM3"}),
    _gpu("AMD MI250X", r"\bMI250X\b",
         "per GCD: torch sees each of the two dies as a device, half the OAM figure",
         fp32=47.85e12, bf16=191.5e12, fp16=191.5e12),
)

# What a CUDA process holds beyond its tensors, measured on the project's H100 (CUDA 13,
# docs/benchmarks/gpu_h100-80gb-hbm3_2026-11-23.md: the context 0.51 GiB before the model,
# 0.75 GiB with the cuBLAS/attention workspaces once a step ran). NCCL's buffers have not
# been measured on a GPU with peers: they are left out, and the estimate says so.
MEASURED_CONTEXT_BYTES = int(0.51 * GiB)
MEASURED_WORKSPACE_BYTES = int(0.24 * GiB)
MEASURED_ON = "NVIDIA H100 80GB HBM3"
MEASURED_SOURCE = "measured on an H100, CUDA 13: docs/benchmarks/gpu_h100-80gb-hbm3_2026-11-23.md"


def gpu_named(device_name: str) -> Gpu | None:
    """The row of a device as torch names it; None when not in the table or a MIG slice
    (whose share of the GPU the name does not tell)."""
    if re.search(r"\bMIG\b", device_name):
        return None
    return next((g for g in GPUS if g.pattern.search(device_name)), None)


def targets() -> dict[str, Gpu]:
    """The rows a target can name, by that name."""
    return {g.target: g for g in GPUS if g.target}
