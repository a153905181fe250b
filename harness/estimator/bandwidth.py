"""A device's memory bandwidth and its link to the other devices of a node, by name.

Datasheet figures (bytes/s) from the one GPU table (training_harness.core.gpus): the memory's,
and the per-direction NVLink (or PCIe) bandwidth a collective between the GPUs of one
node can use. Devices not listed get DEFAULT; on a CPU, gloo between processes of one
host.
"""

from __future__ import annotations

from dataclasses import dataclass

from training_harness.core.gpus import gpu_named


@dataclass(frozen=True)
class Bandwidth:
    memory: float  # bytes/s of the device's memory
    link: float  # bytes/s between two devices of a node, one direction
    source: str


DEFAULT = Bandwidth(1.5e12, 32e9, "an unlisted GPU: assumed HBM 1.5 TB/s, PCIe 32 GB/s")
CPU = Bandwidth(20e9, 2e9, "a CPU: assumed memory 20 GB/s, gloo between processes 2 GB/s")


def bandwidth(device_type: str, device_name: str) -> Bandwidth:
    if device_type != "cuda":
        return CPU
    gpu = gpu_named(device_name)
    if gpu is None or gpu.memory_bandwidth is None or gpu.link is None:
        return DEFAULT
    kind = gpu.extra.get("memory", "memory")
    return Bandwidth(gpu.memory_bandwidth, gpu.link,
                     f"datasheet: {gpu.label}: {kind} {gpu.memory_bandwidth / 1e12:.3g} TB/s, "
                     f"{gpu.link_kind} {gpu.link / 1e9:.0f} GB/s")
