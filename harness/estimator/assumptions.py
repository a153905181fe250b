"""The sentences an estimate states about what it assumes, where they are long."""

from __future__ import annotations

from training_harness.core.plan import Layout
from training_harness.core.units import format_bytes
from training_harness.estimator.facts import ModelFacts
from training_harness.estimator.pipeline import in_flight
from training_harness.estimator.rank import RankMemory
from training_harness.estimator.settings import Settings


def _frozen(facts: ModelFacts, cfg: Settings) -> str:
    """What the gradients and optimizer state leave out: the frozen parameters."""
    trainable = sum(p.numel for p in facts.params if p.trainable)
    if not facts.params or trainable == facts.parameters:
        return ""
    why = " (LoRA's adapters)" if cfg.lora is not None else ""
    return (f", gradients and optimizer state for the {trainable:,} trainable ones{why} "
            "only (frozen parameters have neither)")


def state_assumptions(facts: ModelFacts, cfg: Settings, micro_batch: int) -> list[str]:
    """Parameters, gradients, optimizer state, precision and compile."""
    width = facts.parameter_bytes / max(facts.parameters, 1)
    state = {
        "lamb": f"LAMB's two moments (2 x {width:g})",
        "lars": f"LARS's momentum buffer (1 x {width:g}; biases and gains too)",
        "muon": f"Muon's momentum buffer (1 x {width:g}) for the 2-D weights inside the "
                f"blocks and AdamW's two moments (2 x {width:g}) for the rest",
    }.get(cfg.optimizer, f"AdamW's two moments (2 x {width:g})")
    if cfg.averaging:
        state += f", and weight averaging's copy of the trainable parameters (1 x {width:g})"
    out = [
        f"Parameters ({width:g} bytes each, their dtype), gradients ({width:g}) and "
        f"{state} for Ψ = {facts.parameters:,} unique "
        f"parameters (tied weights once){_frozen(facts, cfg)}; gradients are held once, also "
        "across accumulation micro-steps.",
        f"Activations are for one micro-batch of {micro_batch} samples per device.",
    ]
    if cfg.amp is not None:
        out.append(
            f"Autocast ({cfg.amp}) keeps master weights, gradients and optimizer state fp32 "
            "and 16-bit activations for matmul inputs."
        )
    if cfg.compile or cfg.cross_entropy == "compile":
        out.append(
            "torch.compile is estimated as eager: its partitioner usually saves fewer "
            "activations, so the estimate is high."
        )
    if cfg.float8:
        out.append(
            f"float8 ({cfg.float8}) is estimated as the plan without it: neither its "
            "matmuls' fp8 peak nor its casts' traffic is modelled (on one H200, GPT-2 "
            "small at micro-batch 64 stepped 2.7x as long as bf16 eager, 1.09x compiled); "
            "the tuner learns it from the study's trials."
        )
    if cfg.sdpa_backend != "auto":
        out.append(
            f"SDPA's backend '{cfg.sdpa_backend}' is estimated as "
            + ("the math path: fp32 scores and probabilities kept, as explicit attention "
               "keeps them" if cfg.sdpa_backend == "math" else
               "a fused kernel: no s² terms, a log-sum-exp per row and head")
            + "; its speed is not modelled apart from the FLOPs."
        )
    if cfg.sparse_attention is not None:
        p = cfg.sparse_attention
        out.append(
            f"sparse_attention (window {p.window}, {p.global_tokens} global tokens, blocks of "
            f"{p.block}) is estimated as FlexAttention: no s² terms (as fused SDPA), and "
            "the attention FLOPs at the share of (query, key) blocks its BlockMask computes; "
            "an hf: model's traced attention is its own implementation's (an upper bound)."
        )
    if cfg.channels_last:
        out.append(
            "channels_last is estimated as the plan without it: the same tensors in another "
            "layout hold the same bytes, and its convolutions' speed is not modelled; the "
            "tuner learns it from the study's trials."
        )
    if cfg.liger:
        kernels = [k for k in cfg.liger if k != "fused_linear_cross_entropy"]
        out.append(
            f"liger ({', '.join(cfg.liger)}) is estimated as the plan without it"
            + (", except the logits: its fused linear cross-entropy as the fused strategy's "
               "(one chunk of logits at a time, the head's gradients made in forward)"
               if "fused_linear_cross_entropy" in cfg.liger else "")
            + (f"; its {', '.join(kernels)} kernels as torch's ops (they keep no more, an "
               "upper bound)" if kernels else "")
            + "; its speed is not modelled: the tuner learns it from the study's trials."
        )
    return out


def _state_psi(cfg: Settings) -> str:
    """The optimizer state per parameter, as a multiple of Ψ (training_harness.estimator.state)."""
    return {"lars": "4Ψ", "muon": "4Ψ to 8Ψ"}.get(cfg.optimizer, "8Ψ")


def parallel_assumptions(cfg: Settings, layout: Layout, worst: RankMemory,
                         peaks: list[int], bubble: float) -> list[str]:
    """What the estimate says about splitting the work over several devices."""
    par, out = cfg.parallel, []
    if par.data > 1 and (par.ddp or par.fsdp):
        out.append(_data_parallel(cfg, worst))
    if par.pipeline > 1:
        rank = peaks.index(max(peaks))
        out.append(
            f"Pipeline over {par.pipeline} ranks ({par.pipeline * par.virtual} stages, "
            f"{par.virtual} per rank, looped), schedule {par.schedule}, {par.microbatches} "
            "micro-batches: in flight per stage at each rank's peak "
            f"{[in_flight(par, r) for r in range(par.pipeline)]}; when a rank runs all its "
            "forwards before its first backward, its peak has no gradients yet. Each stage "
            "keeps its output per micro-batch in flight and a receive buffer per micro-batch "
            "for its input (all but the first stage) and its output's gradient (all but the "
            "last); the last stage keeps every micro-batch's logits, which the schedule "
            "merges when the step ends (pipeline_buffers). "
            f"Memory is the largest rank's (pipeline rank {rank}; stage_memory_bytes gives "
            f"each rank's). Bubble (p − 1)/(v·m + p − 1) = {bubble:.3f}."
        )
    if par.tensor > 1:
        out.append(
            f"Tensor parallel over {par.tensor} ranks (Megatron's split, no sequence "
            "parallel): the QKV and output projections"
            + (" and the MLP" if par.tensor_mlp else "")
            + " are split, their weights and the activations inside the split divided by t "
            "(Korthikanti et al. eq. 2 with the paper's widths: s·b·h·(10 + 24/t + "
            "5·a·s/(h·t))); LayerNorm inputs, the residual stream, the QKV and FC1 inputs, "
            "dropout masks, norms, embeddings and the head are whole on every rank."
        )
    unused = [
        f"{name} = {n}" for name, n, used in (
            ("data", layout.data, par.ddp or par.fsdp),
            ("pipeline", layout.pipeline, par.pipeline > 1),
            ("tensor", layout.tensor, par.tensor > 1),
        ) if n > 1 and not used
    ]
    if unused:
        out.append(
            f"Layout {layout.data} x {layout.pipeline} x {layout.tensor} (data x pipeline x "
            f"tensor), {', '.join(unused)} with no strategy splitting over it: every device "
            "there is taken to hold the whole model, its gradients and optimizer state; only "
            "the FLOPs are divided over the ranks."
        )
    if layout.world_size > 1:
        out.append(
            "Communication time is modelled on a GPU (the step time says how) and taken "
            "to overlap with compute on a CPU; the collectives' own buffers (NCCL's, "
            "gloo's) are not counted."
        )
    return out


def _data_parallel(cfg: Settings, worst: RankMemory) -> str:
    par, st = cfg.parallel, worst.state
    n = par.data
    if not par.fsdp:
        text = (
            f"DDP over {n} data ranks: each holds the whole model and its gradients, in DDP's "
            "buckets, which are made when the model is wrapped and kept all step"
            + ("" if par.bucket_view else
               " (gradient_as_bucket_view off: the buckets are a second copy, gradient_buckets, "
               "beside the gradients backward makes)")
            + (f"; {par.compression} compression adds a 16-bit copy of one bucket "
               f"({par.bucket_cap_mb:g} MB) and halves the bytes all-reduced"
               if par.compression in ("fp16", "bf16") else "")
            + (powersgd_assumption(par) if par.compression == "powersgd" else "")
        )
        if par.zero == 1:
            return text + (
                f". ZeRO stage 1 (ZeroRedundancyOptimizer) partitions the optimizer state by "
                "whole parameters, largest first to the rank with the fewest elements so far; "
                f"the fullest rank's is {format_bytes(st.optimizer_state)} "
                f"(≈ {_state_psi(cfg)}/{n})."
            )
        return text + ", and the whole optimizer state."
    cw = "16-bit" if par.fsdp_mixed else "full-width"
    text = (
        f"ZeRO stage {par.zero} (FSDP2) over {n} data ranks: parameters, gradients and "
        f"optimizer state in shards of ceil(rows / {n}) rows of each parameter (4Ψ/{n}, "
        f"4Ψ/{n}, {_state_psi(cfg)}/{n}; rank 0's the largest). The gathered {cw} parameters ("
        + ("all of them, kept from forward to the end of backward"
           if par.zero == 2 or par.pipeline > 1 else
           "the root's, i.e. embeddings, final norm and head, through forward and backward, "
           "and two blocks' at a time, one computing, one prefetched")
        + f": {format_bytes(st.gathered)}) and, in backward, the gradients awaiting their "
        "reduce-scatter (the root's until the end, a block's with its reduce-scatter input) "
        "come on top."
    )
    if worst.grads_held and par.microbatches > 1:
        text += " Between micro-steps (no_sync) the unsharded gradients accumulate."
    if par.fsdp_mixed:
        text += (
            f" FSDP's mixed precision gathers {cfg.amp} copies of the fp32 shards: autocast "
            "makes no weight copies and the residual stream is 16-bit (CUDA's LayerNorm "
            "still keeps an fp32 copy of its input)."
        )
    if par.offload:
        text += (
            f" Offload: the shards ({format_bytes(st.offloaded)}) live on the CPU, outside "
            "the device's peak, and the optimizer steps there." if st.offloaded else
            " Offload on a CPU device moves nothing: the shards stay where they are."
        )
    return text


def powersgd_assumption(par) -> str:
    return (
        f"; PowerSGD rank {par.powersgd_rank} is estimated after its warm-up (the steady "
        f"step; its first {par.start_powersgd_iter} steps all-reduce the whole gradients, "
        "as plain DDP, and a trial measures the compressed step only once its warm-up "
        "steps reach that count): each gradient matrix n x m sends (n + m) x rank "
        "elements where that is under half of n x m, 1-D tensors whole; its error-feedback "
        "buffers (the gradients' size) and P, Q factors are kept all run, counted with the "
        "gradient buckets, and the hook copies a bucket and its new error while it runs; "
        "its matmuls, orthogonalisation and its two all-reduces in sequence per bucket "
        "are not timed"
    )


def checkpoint_assumption(every: int | None, checkpointed: int, layers: int | None) -> str:
    return (
        f"Checkpointing every {every} block(s): blocks 0, {every}, ... ({checkpointed} of "
        f"{layers}) keep only their input; one is rebuilt at a time in backward (recompute), "
        "adding one forward of each checkpointed block to the step's FLOPs."
    )


def peak_assumption(held: str | None, buckets: bool = False) -> str:
    """`held`: why gradients live before backward makes them (None: they do not)."""
    return (
        "Peak = parameters, optimizer state and buffers"
        + (", DDP's separate gradient buckets" if buckets else "")
        + ", plus the largest moment of a step: "
        "the end of forward (autocast's weight cache still full), the start of backward "
        "(activations with the loss's or a block's working set, gradients not yet allocated"
        + (f", except {held}" if held else "")
        + "), the rebuild of a checkpointed block, or the optimizer step (gradients "
        "and its temporaries). Allocator fragmentation and caching are not counted; "
        "upper_bound_bytes adds every component instead."
    )
