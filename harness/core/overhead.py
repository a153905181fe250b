"""What a process holds on its device beyond its tensors (the CUDA context, cuBLAS and
attention workspaces, NCCL's buffers): the figures training_harness.measure.device_overhead
measures once per GPU, and the estimator adds to a CUDA plan's peak. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceOverhead:
    context_bytes: int
    workspace_bytes: int
    nccl_bytes_per_communicator: int
    source: str

    @classmethod
    def none(cls, device_type: str) -> DeviceOverhead:
        return cls(0, 0, 0, f"{device_type}: a process holds no device context")

    @classmethod
    def from_record(cls, d: Any) -> DeviceOverhead | None:
        try:
            values = [int(d[k]) for k in ("context_bytes", "workspace_bytes",
                                          "nccl_bytes_per_communicator")]
            source = str(d["source"])
        except (KeyError, TypeError, ValueError):
            return None
        return cls(*values, source) if min(values) >= 0 else None
