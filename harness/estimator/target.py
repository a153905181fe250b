"""A GPU to plan for without having one: `--target h100-sxm-80gb --gpus 8`.

The estimator needs of a device its name (its bandwidths: training_harness.estimator.bandwidth),
its peak FLOP rate in the plan's matmul dtype, how many GPUs a node has (the parallel
strategies' checks) and what a process holds beyond its tensors. A `Target` gives all
of them from the datasheet table (training_harness.core.gpus), and the overheads the project
measured on its H100 (assumed alike on the other GPUs, and said so).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.gpus import (
    MEASURED_CONTEXT_BYTES,
    MEASURED_ON,
    MEASURED_SOURCE,
    MEASURED_WORKSPACE_BYTES,
    Gpu,
    targets,
)
from training_harness.core.overhead import DeviceOverhead
from training_harness.core.units import format_bytes
from training_harness.estimator.profiled_step import DeviceProfile


@dataclass(frozen=True)
class Target:
    gpu: Gpu
    gpus: int  # GPUs the plans may use, all of one kind

    @classmethod
    def named(cls, name: str, gpus: int = 8) -> Target:
        """The target `name` (HarnessError, listing the known names, for another)."""
        known = targets()
        if name not in known:
            raise HarnessError(f"--target {name!r}: unknown; known targets: "
                               f"{', '.join(sorted(known))}")
        if gpus < 1:
            raise HarnessError(f"--gpus {gpus}: give 1 or more")
        return cls(known[name], gpus)

    @property
    def name(self) -> str:
        return str(self.gpu.target)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpu.gpus_per_node)

    def runtime(self) -> RuntimeEnv:
        """The environment the strategies' checks and the estimator see: CUDA, this GPU."""
        return RuntimeEnv(device_type="cuda", device_name=self.gpu.torch_name,
                          device_count=min(self.gpus, self.gpu.gpus_per_node),
                          bf16="bf16" in self.gpu.flops, triton=True)

    def peak_flops(self, dtype: str) -> float | None:
        """The datasheet's dense peak in the plan's compute dtype ("fp32" runs at the fp32
        rate: torch's default leaves TF32 off for matmuls)."""
        return self.gpu.flops.get(dtype)

    def profile(self) -> DeviceProfile | None:
        """The profile measured on this GPU (`harness calibrate --device cuda --out`, kept in
        harness/estimator/profiles/<target>.json), or None: then the step comes from the
        datasheet's peak, and the estimate says so."""
        return _shipped_profile(self.name)

    def overhead(self) -> DeviceOverhead:
        """The context and workspaces measured on the H100; NCCL's buffers unmeasured (0)."""
        alike = "" if self.gpu.torch_name == MEASURED_ON else f", assumed alike on {self.gpu.label}"
        return DeviceOverhead(MEASURED_CONTEXT_BYTES, MEASURED_WORKSPACE_BYTES, 0,
                              f"{MEASURED_SOURCE}{alike}; NCCL's buffers not measured, "
                              "not counted")

    def describe(self) -> str:
        """One line: the GPU, how many, and its sheet."""
        g = self.gpu
        where = f"{self.gpus} x {g.label}" + (f" ({self.nodes} nodes of {g.gpus_per_node})"
                                              if self.nodes > 1 else "")
        memory = format_bytes(g.memory_bytes) if g.memory_bytes else "?"
        bf16 = g.flops.get("bf16")
        return (f"{where}: {memory} each, bf16 {bf16 / 1e12:.0f} TFLOP/s dense"
                if bf16 else f"{where}: {memory} each") + (
            f", {g.link_kind} {g.link / 1e9:.0f} GB/s" if g.link else "")


def target_table() -> str:
    """Every target with its sheet, one line each (`harness plan --list-targets`)."""
    lines = [f"  {'target':<16} {'GPU':<24} {'memory':>10} {'bf16':>10} {'fp8':>10} "
             f"{'HBM':>9} {'link':>9}"]
    for name, g in sorted(targets().items()):
        mem = format_bytes(g.memory_bytes) if g.memory_bytes else "-"
        bf16 = f"{g.flops['bf16'] / 1e12:.0f} TF" if "bf16" in g.flops else "-"
        fp8 = f"{g.flops['fp8'] / 1e12:.0f} TF" if "fp8" in g.flops else "-"
        hbm = f"{g.memory_bandwidth / 1e12:.2f} TB/s" if g.memory_bandwidth else "-"
        link = f"{g.link / 1e9:.0f} GB/s" if g.link else "-"
        lines.append(f"  {name:<16} {g.label:<24} {mem:>10} {bf16:>10} {fp8:>10} "
                     f"{hbm:>9} {link:>9}")
    return "\n".join(lines)


@functools.cache
def _shipped_profile(name: str) -> DeviceProfile | None:
    """Read once per process: `harness plan` asks for every plan it ranks."""
    path = Path(__file__).parent / "profiles" / f"{name}.json"
    return DeviceProfile(json.loads(path.read_text())) if path.is_file() else None
