"""What a surface assumes about the hardware and the software stack, as one object passed
down to the time and memory models (gpt_time.py, gpt_memory.py, h100.py), so that a family
of surfaces (family.py) can differ from the project's H100 picture in stated ways.

`BASE` is that picture: every default below is the figure h100.py's docstring states and
the two original surfaces use (they give exactly the same answers as before this object
existed). A field is either an absolute figure (a bandwidth, a latency, a size) or a
multiplier on a figure of the model (1.0: as h100.py states it).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Assumptions:
    # -- collectives and point-to-point (H4) -------------------------------------------
    busbw: float = 360e9
    """NCCL bus bandwidth for large messages, bytes/s (NVLink 4 / NVSwitch)."""
    half_bw_bytes: float = 2e6
    """Message size at which a collective reaches half of `busbw`."""
    collective_latency: float = 20e-6
    """Seconds per collective."""
    p2p_bw: float = 400e9
    """GPU-to-GPU bandwidth one way, bytes/s (pipeline boundaries)."""
    p2p_latency: float = 30e-6
    dp_overlap: float = 0.9
    """Share of the last backward that hides data-parallel gradient reductions (S3, S4)."""
    prefetch_overlap: float = 0.85
    """Share of a forward (backward) that hides ZeRO-2/3's all-gathers (S4)."""
    # -- compute (H5, T1, T2) ----------------------------------------------------------
    gemm_top16: float = 0.74
    """The 16-bit GEMM efficiency curve's ceiling: top x w/(w+W) x tok/(tok+T)."""
    gemm_width16: float = 200.0
    """W: the width at which 16-bit GEMMs reach half their ceiling."""
    gemm_tokens16: float = 1024.0
    """T: the tokens per micro-batch at which 16-bit GEMMs reach half their ceiling."""
    gemm_top32: float = 0.78
    gemm_width32: float = 64.0
    gemm_tokens32: float = 256.0
    flash_eff: float = 0.42
    """SDPA's flash kernels (16-bit), share of the peak."""
    mem_eff_attention: float = 0.55
    """SDPA's memory-efficient kernels (fp32), share of the fp32 peak."""
    explicit_attention: float = 0.75
    """Eager attention's batched GEMMs, share of the GEMM efficiency."""
    # -- memory-bound work (H2, T3, T4, S5) --------------------------------------------
    hbm_eff: float = 0.80
    """Element-wise kernels stream at this share of HBM bandwidth."""
    optimizer_eff: float = 0.85
    """The optimizer step streams at this share of HBM bandwidth."""
    # -- recompute (T6) -----------------------------------------------------------------
    recompute: float = 1.0
    """Multiplier on the work a checkpointed block does again in backward (its forward)."""
    # -- the CPU issuing work (T7) ------------------------------------------------------
    eager_launch: float = 1.0
    """Multiplier on every eager CPU cost: ops, autograd nodes, DTensor, FSDP hooks."""
    compiled_launch: float = 1.0
    """Multiplier on a compiled block's CPU cost (its kernels' launches, graph calls)."""
    # -- what torch.compile buys (T2, T3) -----------------------------------------------
    compile_elementwise: float = 0.4
    """A compiled block's element-wise traffic, as a share of the eager block's."""
    compile_scores: float = 0.45
    """Eager attention's score traffic under compile, as a share of eager's."""
    compile_time: float = 1.0
    """Multiplier on torch.compile's wall-clock seconds (W2)."""
    # -- memory (H3, M2, M4, M5) --------------------------------------------------------
    context: float = int(0.75 * GIB)
    """Bytes held beside the tensors: CUDA context, cuBLAS/cuDNN workspaces."""
    compiled_extra: float = int(0.25 * GIB)
    nccl_buffers: float = int(0.5 * GIB)
    activations: float = 1.0
    """Multiplier on activation bytes (kept for backward, and passing through it)."""
    cache_base: float = 0.08
    """The caching allocator's reserve above the peak, before the logits' share."""
    oom_slack: float = 0.03
    """Fragmentation the allocator cannot give back: OOM at beside + allocated x (1+this)."""
    # -- trials (W1, W3) ------------------------------------------------------------------
    start: float = 1.0
    """Multiplier on a trial's start-up seconds."""
    noise: float = 0.04
    """samples/s x (1 + u), u uniform in [-noise, noise] per (plan, repeat)."""


BASE = Assumptions()
