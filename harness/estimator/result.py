"""What an estimate returns: `Estimate`, its memory components and its record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from training_harness.core.units import format_bytes

# The components of `Estimate.memory`, in the order they are shown.
COMPONENTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "buffers",
    "autocast_weight_copies",
    "activations",
    "other_activations",
    "logits",
    "backward_working",
    "recompute",
    "optimizer_temporaries",
    "gathered_parameters",
    "communication_buffers",
    "gradient_buckets",
    "pipeline_buffers",
    "device_context",
    "nccl_buffers",
    "distill_teacher",
)

# The parts of a predicted step (seconds, one rank's): FLOPs at the assumed MFU (compute;
# recompute, a checkpoint's forward again), the pipeline's bubble, kernel launches, exposed
# data-parallel and tensor-parallel traffic, the optimizer step. The step time is
#     max(compute + recompute + bubble, launches) + data + tensor + optimizer
# (a CPU's: compute + recompute + bubble; training_harness.estimator.step_costs).
STEP_PARTS = ("compute", "recompute", "bubble", "launches", "data", "tensor", "optimizer")


@dataclass
class Estimate:
    """Predicted per-device peak memory and step time of one plan.

    `memory` holds bytes per component (all of `COMPONENTS`, zero where one does
    not apply): parameters, gradients, optimizer_state, buffers;
    autocast_weight_copies (the 16-bit weight copies autocast makes in forward);
    activations (what the repeated blocks keep for backward, or the whole
    model's when it has no blocks); other_activations (what the rest keeps:
    token ids, embeddings, final norm, head input, loss); logits (the
    language-model loss's transient at the start of backward);
    backward_working (the most one block's or op's backward holds beyond what
    it saved); recompute (one checkpointed block's activations, rebuilt in
    backward); optimizer_temporaries (the optimizer step's scratch memory);
    gathered_parameters (FSDP's unsharded parameters while forward and backward
    run); communication_buffers (gradients awaiting their reduction, and its
    buffers); gradient_buckets (DDP's buckets when they are not the gradients'
    own storage); pipeline_buffers (the stage outputs a pipeline schedule keeps);
    device_context (the CUDA context and the cuBLAS/attention workspaces) and
    nccl_buffers (NCCL's, per communicator), measured once per GPU and zero on a CPU;
    distill_teacher (a distillation teacher's weights and the logits its KL keeps).

    All of it is per device, on the largest rank. `phases` gives what lives
    above the persistent state at each moment of a step; the peak is the
    persistent state (parameters, optimizer_state, buffers, gradient_buckets)
    plus the largest phase. `upper_bound_bytes` sums every component.

    `sharding` says how the data-parallel strategy holds the state (strategy,
    ZeRO stage, data ranks, bytes on the device and on the CPU); `pipeline` the
    stages, schedule, micro-batches, bubble fraction, and per pipeline rank the
    micro-batches in flight, its peak (`stage_memory_bytes`), its parameters and
    its persistent state; `tensor` the tensor-parallel ranks.
    """

    peak_memory_bytes: int
    step_time_s: float | None
    memory: dict[str, int]
    flops_per_step: float
    assumptions: list[str]
    phases: dict[str, int] = field(default_factory=dict)
    upper_bound_bytes: int = 0
    # Bytes of one transformer block's saved tensors, by term (empty when traced).
    block_terms: dict[str, int] = field(default_factory=dict)
    assumed_mfu: float | None = None
    sharding: dict[str, Any] = field(default_factory=dict)
    pipeline: dict[str, Any] = field(default_factory=dict)
    tensor: dict[str, Any] = field(default_factory=dict)
    # What the CUDA process holds beyond its tensors (device_context + nccl_buffers),
    # counted in peak_memory_bytes; 0 on a CPU or when not measured.
    device_overhead_bytes: int = 0
    # The step time's parts in seconds (STEP_PARTS; empty without a peak), for a search
    # that learns which of the estimator's assumptions a machine breaks.
    step_parts: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The `predicted` entry of a result record (JSON-ready): every field, copied."""
        return asdict(self)

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"peak memory  {format_bytes(self.peak_memory_bytes)} per device "
            f"(all components added: {format_bytes(self.upper_bound_bytes)})"
        ]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.memory.items() if n]
        lines += ["moments of a step, above parameters, optimizer state and buffers:"]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.phases.items()]
        time = "unknown (no peak FLOP rate)" if self.step_time_s is None else (
            f"{self.step_time_s:.4g} s"
        )
        lines.append(f"step time    {time}  ({self.flops_per_step:.3e} FLOPs per step)")
        lines += self._parallel_lines()
        lines.append("assumptions:")
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)

    def _parallel_lines(self) -> list[str]:
        lines = []
        shard = self.sharding
        if shard.get("strategy", "none") != "none":
            stage = f" stage {shard['stage']}" if shard["strategy"] == "zero" else ""
            cpu = f", {format_bytes(shard['cpu_bytes'])} on the CPU" if shard["cpu_bytes"] else ""
            lines.append(f"data parallel  {shard['strategy']}{stage} over "
                         f"{shard['data_ranks']} ranks{cpu}")
        pipe = self.pipeline
        if pipe.get("stages", 1) > 1:
            stages = ", ".join(format_bytes(n) for n in pipe["stage_memory_bytes"])
            lines.append(f"pipeline     {pipe['stages']} ranks, {pipe['schedule']}, bubble "
                         f"{100 * pipe['bubble']:.1f}%, peak per rank: {stages}")
        if self.tensor.get("ranks", 1) > 1:
            lines.append(f"tensor       {self.tensor['ranks']} ranks")
        return lines
