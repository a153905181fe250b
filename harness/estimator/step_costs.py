"""A GPU step's time beyond its FLOPs: kernel launches, communication, the optimizer.

FLOPs over a fixed share of the peak cannot prefer the large micro-batches a
launch-bound GPU needs, nor see what tensor or data parallel send. On CUDA a step is

    max(compute, launches)  +  exposed data-parallel traffic  +  tensor-parallel traffic
                            +  the optimizer step

    compute     FLOPs per device / (peak x COMPUTE_MFU) / (1 - pipeline bubble)
    launches    micro-steps x kernels per micro-step x LAUNCH_S: the host issues
                kernels while the device runs earlier ones, so a step takes the
                longer of the two (a small micro-batch is launch-bound); compile fuses
                kernels (COMPILED_KERNELS of them)
    data        DDP and ZeRO-1 all-reduce the gradients (2 (d-1)/d of their bytes on the
                wire: 16-bit or PowerSGD's factors with compression, estimator.compression),
                ZeRO-2 reduce-scatters them and all-gathers the parameters, ZeRO-3
                gathers the parameters for forward and backward of every micro-step;
                over the link's bandwidth, DATA_EXPOSED of it not hidden behind backward
    tensor      4 all-reduces of a micro-batch's activations per layer and micro-step
                (2 forward, 2 backward; 2 (t-1)/t of their bytes), not overlapped
    optimizer   the bytes an optimizer step reads and writes (parameters and its state
                twice, gradients once) at the device memory's bandwidth; a for-loop
                optimizer also launches a few kernels per parameter tensor (torch's
                default on DTensors; on plain CUDA tensors it is foreach)

The bandwidths are the datasheet's (training_harness.estimator.bandwidth). Every constant here
is an assumption the tuner corrects from the study's own trials
(training_harness.tune.model.step_fit); `harness estimate` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from training_harness.estimator.bandwidth import Bandwidth

COMPUTE_MFU = 0.5  # of the peak, on large matmuls with nothing else in the way
LAUNCH_S = 6e-6  # host time to issue one kernel (eager PyTorch, CUDA)
KERNELS_PER_BLOCK = 45  # forward and backward of a transformer block, eager
COMPILED_KERNELS = 0.3  # compile fuses the element-wise ones: this share is left
OTHER_KERNELS = 40  # embedding, head, loss, per micro-step
DATA_EXPOSED = 0.5  # of the data-parallel traffic, not overlapped with backward
# kernels per parameter tensor; "loop" is torch's for-loop implementation
OPTIMIZER_KERNELS = {"loop": 6, "foreach": 0.2, "fused": 0.05, "triton": 0.05}


def default_impl(zero: int, tensor: int) -> str:
    """What torch's AdamW runs when no implementation is asked for, on CUDA: foreach
    when every parameter is a plain tensor (torch.optim.optimizer's
    `_default_to_fused_or_foreach`), the for-loop for FSDP2's and tensor parallel's
    DTensors (ZeRO 2 and 3 here). Read from torch's code: the H200 pages' tiny plans,
    host-bound, cannot tell 1.9 ms apart (quickstart, default AdamW, stepped in 6.8 and
    10.3 ms on two machines; the fused plan, SDPA and fused AdamW, in 7.8 and 6.7)."""
    return "loop" if zero >= 2 or tensor > 1 else "foreach"


@dataclass(frozen=True)
class StepCosts:
    """What one rank's step moves and launches (made in training_harness.estimator.estimate)."""

    microsteps: int
    blocks: int  # this rank's transformer blocks (a pipeline stage's share)
    compiled: bool
    data: int  # data-parallel ranks
    zero: int  # ZeRO stage (0: DDP or none)
    model_bytes: int  # this rank's share of the parameters, full width (tensor/pipeline)
    state_touched_bytes: int  # parameters + optimizer state on this rank
    gradient_bytes: int
    param_tensors: int
    optimizer_impl: str
    tensor: int  # tensor-parallel ranks
    activation_bytes: int  # one micro-batch's layer output (micro x seq x hidden x width)
    wire_bytes: int | None = None  # DDP's all-reduce per step, compressed; None: the gradients
    # per micro-step beyond OTHER_KERNELS: the fused linear cross-entropy's, per chunk
    head_kernels: int = 0


def step_of(parts: dict[str, float]) -> float:
    """A CUDA step's seconds from its parts: the FLOPs (with the pipeline's bubble) overlap
    the kernel launches, and the rest adds."""
    flops = parts["compute"] + parts["recompute"] + parts["bubble"]
    return max(flops, parts["launches"]) + parts["data"] + parts["tensor"] + parts["optimizer"]


def cuda_step_time(compute_flops_s: float, costs: StepCosts, bw: Bandwidth,
                   bubble: float, recompute_share: float = 0.0
                   ) -> tuple[float, str, dict[str, float]]:
    """(seconds, the sentence saying how, its parts: training_harness.estimator.result.STEP_PARTS)
    for a CUDA step whose FLOPs alone take `compute_flops_s` at COMPUTE_MFU,
    `recompute_share` of them a checkpoint's recompute."""
    compute = compute_flops_s / (1 - bubble)
    per_block = KERNELS_PER_BLOCK * (COMPILED_KERNELS if costs.compiled else 1.0)
    others = OTHER_KERNELS + costs.head_kernels
    launches = costs.microsteps * (costs.blocks * per_block + others) * LAUNCH_S
    d = costs.data
    share = (d - 1) / d if d > 1 else 0.0
    if costs.zero >= 3:
        moved = share * costs.model_bytes * (2 * costs.microsteps + 1)
    elif costs.zero == 2:
        moved = share * (costs.gradient_bytes + costs.model_bytes)
    else:
        moved = 2 * share * (costs.gradient_bytes if costs.wire_bytes is None
                             else costs.wire_bytes)
    data = DATA_EXPOSED * moved / bw.link
    t = costs.tensor
    tensor = (costs.microsteps * costs.blocks * 4 * 2 * (t - 1) / t * costs.activation_bytes
              / bw.link) if t > 1 else 0.0
    touched = 2 * costs.state_touched_bytes + costs.gradient_bytes
    impl = (default_impl(costs.zero, costs.tensor) if costs.optimizer_impl == "default"
            else costs.optimizer_impl)
    optimizer = touched / bw.memory + costs.param_tensors * OPTIMIZER_KERNELS.get(
        impl, 1.0) * LAUNCH_S
    parts = {"compute": compute_flops_s * (1 - recompute_share),
             "recompute": compute_flops_s * recompute_share, "bubble": compute - compute_flops_s,
             "launches": launches, "data": data, "tensor": tensor, "optimizer": optimizer}
    total = step_of(parts)
    how = (f"Step time = max(compute {compute * 1e3:.3g} ms at MFU {COMPUTE_MFU:g}"
           + (f" / (1 - bubble {bubble:.3f})" if bubble else "")
           + f", kernel launches {launches * 1e3:.3g} ms: {costs.microsteps} micro-step(s) "
           f"x ~{costs.blocks * per_block + others:.0f} kernels x {LAUNCH_S * 1e6:g} us)"
           + (f" + data-parallel traffic {data * 1e3:.3g} ms ({DATA_EXPOSED:g} of "
              f"{moved / 2**20:.0f} MiB not overlapped, {bw.link / 1e9:.0f} GB/s)" if data else "")
           + (f" + tensor-parallel all-reduces {tensor * 1e3:.3g} ms" if tensor else "")
           + f" + optimizer step {optimizer * 1e3:.3g} ms ({touched / 2**20:.0f} MiB at "
           f"{bw.memory / 1e9:.0f} GB/s); {bw.source}.")
    return total, how, parts
