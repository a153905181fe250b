"""A device's memory bandwidth and its link to the other devices of a node, by name.

Datasheet figures (bytes/s): HBM per GPU, and the per-direction NVLink (or PCIe)
bandwidth a collective between the GPUs of one node can use. Devices not listed get
DEFAULT; on a CPU, gloo between processes of one host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Bandwidth:
    memory: float  # bytes/s of the device's memory
    link: float  # bytes/s between two devices of a node, one direction
    source: str


_TABLE = (  # (name pattern, HBM, link, what)
    (r"\bH200\b", 4.8e12, 450e9, "NVIDIA H200: HBM3e 4.8 TB/s, NVLink 450 GB/s"),
    (r"\bH100\b.*\bPCIe\b", 2.0e12, 64e9, "NVIDIA H100 PCIe: HBM2e 2.0 TB/s, PCIe Gen5"),
    (r"\bH100\b.*\bNVL\b", 3.9e12, 300e9, "NVIDIA H100 NVL: HBM3 3.9 TB/s, NVLink bridge"),
    (r"\bH100\b", 3.35e12, 450e9, "NVIDIA H100 SXM: HBM3 3.35 TB/s, NVLink 450 GB/s"),
    (r"\bA100\b.*\bPCIe\b", 1.9e12, 32e9, "NVIDIA A100 PCIe: HBM2e 1.9 TB/s, PCIe Gen4"),
    (r"\bA100\b", 2.0e12, 300e9, "NVIDIA A100 SXM: HBM2e 2.0 TB/s, NVLink 300 GB/s"),
    (r"\bL40S?\b", 0.86e12, 32e9, "NVIDIA L40(S): GDDR6 0.86 TB/s, PCIe Gen4"),
    (r"\bL4\b", 0.3e12, 32e9, "NVIDIA L4: GDDR6 0.3 TB/s, PCIe Gen4"),
)
DEFAULT = Bandwidth(1.5e12, 32e9, "an unlisted GPU: assumed HBM 1.5 TB/s, PCIe 32 GB/s")
CPU = Bandwidth(20e9, 2e9, "a CPU: assumed memory 20 GB/s, gloo between processes 2 GB/s")


def bandwidth(device_type: str, device_name: str) -> Bandwidth:
    if device_type != "cuda":
        return CPU
    for pattern, memory, link, what in _TABLE:
        if re.search(pattern, device_name):
            return Bandwidth(memory, link, f"datasheet: {what}")
    return DEFAULT
