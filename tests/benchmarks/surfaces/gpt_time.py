"""Step time of the GPT workload on H100s (the assumptions: h100.py's docstring; the
figures a family of surfaces varies come in an assumptions.Assumptions, BASE by default)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.benchmarks.surfaces.assumptions import BASE, Assumptions
from tests.benchmarks.surfaces.config import Config
from tests.benchmarks.surfaces.gpt_shape import Stage, stages
from tests.benchmarks.surfaces.hardware import (
    COMPILED_CALL,
    COMPILED_LAUNCH,
    EAGER_BWD_OP,
    EAGER_FWD_OP,
    HBM_BW,
    PEAK,
    collective,
    gemm_efficiency,
)

OVERLAP_LOSS = 0.05  # of the shorter of GPU and CPU time, lost where they should overlap


@dataclass
class MicroStep:
    """One micro-batch's forward and backward on one rank of a stage."""

    gpu: float  # seconds of GPU work (kernels, tensor-parallel all-reduces)
    cpu: float  # seconds the CPU needs to issue it
    fwd: float  # the forward's share of `gpu`
    bwd: float  # the backward's share

    @property
    def time(self) -> float:
        return max(self.gpu, self.cpu) + OVERLAP_LOSS * min(self.gpu, self.cpu)


def fsdp_mixed(c: Config) -> bool:
    return c.dp == "zero" and c.zero_stage >= 2 and c.zero_mixed and c.dtype != "fp32"


def micro_step(c: Config, st: Stage, a: Assumptions = BASE) -> MicroStep:
    t, h, L = c.tensor, c.hidden, st.layers
    stream = HBM_BW * a.hbm_eff
    amp = c.dtype != "fp32"
    tokens = c.micro * c.seq
    peak = PEAK[c.dtype]
    eff = gemm_efficiency(c.dtype, tokens, h / t, a)
    explicit = c.attention == "explicit"
    # -- the blocks: GEMMs, attention, element-wise ------------------------------------
    blocks = 6 * tokens * (4 + 2 * c.ffn) * h * h * L / t / (peak * eff)
    attn_flops = 12 * c.seq * h * tokens * L / t  # QK^T and AV, forward + backward
    if not explicit:  # flash (16-bit) or memory-efficient (fp32) kernels skip the causal half
        blocks += attn_flops / 2 / (peak * a.flash_eff if amp
                                    else PEAK["fp32"] * a.mem_eff_attention)
    else:  # batched GEMMs over head_dim, then the s x s scores through memory
        blocks += attn_flops / (peak * eff * a.explicit_attention)
        scores = c.micro * c.heads / t * c.seq**2 * L
        blocks += scores * 44 * (a.compile_scores if c.compile else 1.0) / stream
    bpe = 3 if amp else 4  # autocast mixes fp32 (norms, softmax) and 16-bit tensors
    elems = 25 + 50 / t  # hidden-sized elements read/written per token per block
    if c.compile:
        elems *= a.compile_elementwise
    else:
        elems -= 0.4 * 16 * (c.layernorm != "eager") + 0.35 * 24 / t * (c.gelu != "eager")
    blocks += elems * h * bpe * tokens * L / stream
    ck = c.checkpointed
    redo = ck * a.recompute  # the checkpointed blocks' forward runs again in backward
    blocks *= 1 + redo / 3
    gpu = blocks
    # autocast casts each fp32 weight to 16 bits once per micro-step (FSDP's mixed
    # precision casts the shard before gathering it instead)
    if amp:
        gpu += 6 * st.params / (c.data if fsdp_mixed(c) else 1) / stream
    # -- embeddings, head, loss ----------------------------------------------------------
    if st.first:
        gpu += 8 * c.vocab * h / stream  # the embedding's dense gradient
    if st.last:
        gpu += 6 * tokens * h * c.vocab / (peak * gemm_efficiency(c.dtype, tokens, h, a))
        per_logit = {"eager": 36 if amp else 24, "compile": 14, "triton": 8}[c.cross_entropy]
        gpu += tokens * c.vocab * per_logit / stream
    # -- tensor parallel: all-reduces of activations, on the critical path ---------------
    if t > 1:
        per_layer = 2 if c.tp_mlp else 1  # attention out (+ MLP out) forward, and backward
        ar = collective(tokens * h * (2 if amp else 4), t, "all_reduce", a)
        gpu += L * per_layer * (2 + redo) * ar
    # -- the CPU's side -------------------------------------------------------------------
    if c.compile:
        launch, call = COMPILED_LAUNCH * a.compiled_launch, COMPILED_CALL * a.compiled_launch
        fwd_cpu = 12 * launch + call
        per_layer_cpu = fwd_cpu + 18 * launch + call
        # our Triton kernels inside a compiled block: a graph break each
        per_layer_cpu += 100e-6 * sum(k == "triton" for k in (c.layernorm, c.gelu))
    else:
        fwd_ops = 24 + 6 * explicit + 6 * amp
        fwd_cpu = fwd_ops * EAGER_FWD_OP * a.eager_launch
        per_layer_cpu = fwd_cpu + (20 + 5 * explicit + 3 * amp) * EAGER_BWD_OP * a.eager_launch
        swap = {"eager": 0.0, "compile": 30e-6, "triton": 13e-6}  # vs the eager op it replaces
        per_layer_cpu += (2 * swap[c.layernorm] + swap[c.gelu]) * a.eager_launch
        if t > 1:
            per_layer_cpu += 0.5e-3 * a.eager_launch  # DTensor dispatch on the split linears
    cpu = L * (per_layer_cpu + redo * (fwd_cpu + 30e-6))
    if c.dp == "zero" and c.zero_stage >= 2:  # FSDP2 hooks per block
        cpu += L * (0.25e-3 if c.zero_stage == 2 else 0.33e-3) * a.eager_launch
    cpu += 0.05e-3 * st.first + (0.25e-3 + 0.05e-3 * (c.cross_entropy == "triton")) * st.last
    cpu += 0.05e-3 + 0.4e-3 * (c.pipeline > 1)
    fwd = blocks / (3 + redo)  # the forward: a third of the blocks' work before recompute
    return MicroStep(gpu=gpu, cpu=cpu, fwd=fwd, bwd=blocks - fwd)


def optimizer_step(c: Config, st: Stage, a: Assumptions = BASE) -> float:
    zero = c.dp == "zero"
    n_opt = st.params / (c.data if zero else 1)
    if c.zero_offload:  # CPU Adam over PCIe: parameters and gradients both ways
        return n_opt / 0.5e9 + 16 * n_opt / 25e9
    if c.optimizer == "adamw":
        per_param = {"fused": 28, "triton": 30}.get(c.opt_impl, 76)  # "default" = foreach
        cpu = {"fused": 0.3e-3, "triton": 0.2e-3 + 8e-6 * st.tensors}.get(c.opt_impl, 1.2e-3)
    else:  # LAMB (strategies/lamb.py): trust ratios need each tensor's norms
        per_param = 40 if c.opt_impl == "triton" else 100
        cpu = {"triton": 0.5e-3 + 8e-6 * st.tensors,
               "default": st.tensors * 15 * EAGER_FWD_OP * a.eager_launch
               }.get(c.opt_impl, 2.5e-3)
    gpu = n_opt * per_param / (HBM_BW * a.optimizer_eff)
    t = max(gpu, cpu) + OVERLAP_LOSS * min(gpu, cpu)
    if c.dtype == "fp16":  # GradScaler: unscale + inf check over the gradients, one sync
        sharded = zero and c.zero_stage >= 2
        t += 8 * st.params / (c.data if sharded else 1) / (HBM_BW * a.hbm_eff) + 0.3e-3
    return t


def data_parallel(c: Config, st: Stage, last: MicroStep, m: int, a: Assumptions = BASE
                  ) -> float:
    """Exposed seconds per step of the data-parallel collectives."""
    d = c.data
    if d < 2 or c.dp == "none":
        return 0.0
    if c.dp == "ddp" or c.zero_stage == 1:  # gradients all-reduced in buckets, last micro-step
        grad = 4 * st.params * (0.5 if c.compression != "none" else 1.0)
        cap = (c.bucket_mb if c.dp == "ddp" else 25.0) * 1e6
        full, rest = divmod(grad, cap)
        each = collective(min(cap, grad), d, "all_reduce", a)
        total = full * each + (collective(rest, d, "all_reduce", a) if rest else 0.0)
        exposed = max(each, total - a.dp_overlap * last.bwd)
        if c.dp == "zero":  # ZeroRedundancyOptimizer broadcasts each rank's updated shard
            exposed += 4 * st.params * (d - 1) / d / (0.5 * a.busbw)
        return exposed
    per_block = (2 if fsdp_mixed(c) else 4) * st.params / max(1, st.layers)
    one = collective(per_block, d, "all_gather", a)
    gather = max(1, st.layers) * one
    hide = a.prefetch_overlap
    exposed = m * max(one, gather - hide * last.fwd)  # forward all-gathers, each micro-step
    if c.zero_stage == 3:  # gathered again for backward
        exposed += m * max(one, gather - hide * last.bwd)
    rs_one = collective(4 * st.params / max(1, st.layers), d, "reduce_scatter", a)
    exposed += max(rs_one, max(1, st.layers) * rs_one - a.dp_overlap * last.bwd)
    return exposed


def step_time(c: Config, a: Assumptions = BASE) -> float:
    """Seconds per optimizer step (the global batch)."""
    m = c.accumulation
    parts = [(st, micro_step(c, st, a)) for st in stages(c)]
    st, slow = max(parts, key=lambda sm: sm[1].time)
    per_micro = slow.time
    if c.pipeline > 1:
        v = c.virtual if c.schedule == "interleaved-1f1b" else 1
        act = c.micro * c.seq * c.hidden * (2 if c.dtype != "fp32" else 4)
        per_micro += 0.5 * 2 * v * (a.p2p_latency + act / a.p2p_bw)  # half of it exposed
        compute = (m + (c.pipeline - 1) / v) * per_micro  # the bubble: (p-1)/v slots
    else:
        compute = m * per_micro
    comm = max(data_parallel(c, s, ms, m, a) for s, ms in parts)
    opt = max(optimizer_step(c, s, a) for s, _ in parts)
    return compute + comm + opt + 0.5e-3 + 0.2e-3 * (c.world > 1)
