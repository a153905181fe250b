"""Parameters, gradients and optimizer state on a rank, as the data-parallel strategy
holds them, and the optimizer step's scratch memory.

For Ψ parameters of 4 bytes (fp32 masters, also under amp) on N data ranks:

    replicated / ddp  parameters 4Ψ    gradients 4Ψ    optimizer state 8Ψ (two moments)
    zero stage 1      parameters 4Ψ    gradients 4Ψ    optimizer state 8Ψ/N
    zero stage 2      parameters 4Ψ/N  gradients 4Ψ/N  optimizer state 8Ψ/N
    zero stage 3      as stage 2 (the difference is how long parameters stay gathered)
    zero 3 + offload  none of them on a CUDA device: on the CPU instead

Stage 1 is torch's ZeroRedundancyOptimizer: whole parameters, largest first to
the rank holding the fewest elements so far; the fullest rank counts. Stages
2 and 3 are FSDP2: every parameter split on dim 0 in chunks of ceil(rows / N)
rows, so rank 0 holds the most. With amp's 16-bit compute the masters stay
fp32 (FSDP's mixed precision casts the gathered copy: see `rank_state`).

The optimizer state per parameter (`state_factor`): AdamW and LAMB keep two
moments (8Ψ above); LARS one momentum buffer (4Ψ); Muon one momentum buffer for
the 2-D weights inside the blocks and AdamW's two moments for the rest. Weight
averaging (strategies.averaging) keeps one more copy of the trainable parameters
on every rank (not partitioned by ZeRO-1), counted with the optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from training_harness.estimator.compression import powersgd_kept
from training_harness.estimator.facts import Param
from training_harness.estimator.settings import Parallelism, Settings

MIB = 1024 * 1024


@dataclass
class RankState:
    """What one rank holds of the model's state, in bytes on its device."""

    parameters: int
    gradients: int  # at the optimizer step
    optimizer_state: int
    optimizer_sizes: list[int]  # bytes of each tensor the optimizer steps here
    block_gradients: dict[int, int] = field(default_factory=dict)  # per block, as held
    offloaded: int = 0  # parameters, gradients and optimizer state on the CPU instead
    gathered: int = 0  # FSDP's unsharded parameters while forward and backward run
    communication: int = 0  # unreduced gradients and reduction buffers in backward
    buckets: int = 0  # DDP's buckets beside the gradients (not views of them)
    held: int | None = None  # gradients alive all step; None: only across micro-steps


def shard_numel(p: Param, ranks: int) -> int:
    """Elements of data rank 0's FSDP2 shard of `p`: ceil(rows / N) rows."""
    if ranks == 1 or not p.shape:
        return p.numel
    return math.ceil(p.shape[0] / ranks) * math.prod(p.shape[1:])


def zero1_partition(numels: list[int], ranks: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer's split: indices of `numels`, largest first, each to
    the rank with the fewest elements so far (the first such rank)."""
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)
    sizes, parts = [0] * ranks, [[] for _ in range(ranks)]
    for i in order:
        r = sizes.index(min(sizes))
        parts[r].append(i)
        sizes[r] += numels[i]
    return parts


def state_factor(p: Param, optimizer: str) -> int:
    """Optimizer-state tensors the size of `p`: AdamW's and LAMB's two moments; LARS's
    momentum buffer; Muon's momentum buffer for a hidden matrix (2-D, inside a block,
    as strategies.muon picks them), AdamW's two moments for the rest."""
    if optimizer == "lars" or (optimizer == "muon" and p.block is not None
                               and len(p.shape) == 2):
        return 1
    return 2


def rank_state(params: list[Param], par: Parallelism, device_type: str,
               optimizer: str = "adamw", averaging: bool = False) -> RankState:
    """The state `params` (one rank's, in local shapes) take on that rank."""
    train = [p for p in params if p.trainable]
    averages = sum(p.bytes for p in train) if averaging else 0
    if not par.fsdp:
        state = RankState(
            parameters=sum(p.bytes for p in params),
            gradients=sum(p.bytes for p in train),
            optimizer_state=sum(state_factor(p, optimizer) * p.bytes for p in train) + averages,
            optimizer_sizes=[p.bytes for p in train],
            block_gradients=_by_block(train, [p.bytes for p in train]),
        )
        if par.zero == 1 and par.data > 1:
            parts = zero1_partition([p.numel for p in train], par.data)
            mine = max(parts, key=lambda part: sum(train[i].bytes for i in part))
            state.optimizer_sizes = [train[i].bytes for i in mine]
            state.optimizer_state = averages + sum(
                state_factor(train[i], optimizer) * train[i].bytes for i in mine)
        if par.ddp and par.data > 1:  # buckets made when the model is wrapped, kept:
            # the gradients themselves (views of them), or a second copy
            if par.bucket_view:
                state.held = state.gradients
            else:
                state.buckets = state.gradients
            bucket = min(int(par.bucket_cap_mb * MIB), state.gradients)
            if par.compression == "powersgd":  # estimator.compression: its error feedback
                # and factors kept; in the hook a bucket's copy and its new error
                state.buckets += powersgd_kept(params, par)
                state.communication = 2 * bucket
            elif par.compression != "none":  # a 16-bit copy of one bucket on the wire
                state.communication = bucket // 2
        return state
    return _fsdp_state(params, train, par, device_type, optimizer)


def _fsdp_state(params: list[Param], train: list[Param], par: Parallelism,
                device_type: str, optimizer: str = "adamw") -> RankState:
    """ZeRO 2/3 by FSDP2: shards, the gathered copies, the unreduced gradients."""
    shards = [shard_numel(p, par.data) * p.width for p in train]
    state = RankState(
        parameters=sum(shard_numel(p, par.data) * p.width for p in params),
        gradients=sum(shards),
        optimizer_state=sum(state_factor(p, optimizer) * n for p, n in zip(train, shards,
                                                                           strict=True)),
        optimizer_sizes=shards,
        block_gradients=_by_block(train, shards),
    )
    # Gathered copies and unreduced gradients are in amp's dtype with FSDP's mixed
    # precision (reduced in fp32), else in the masters' own.
    width = max((p.width for p in params), default=4)
    compute, reduce = (2, 4) if par.fsdp_mixed else (width, width)
    root = sum(p.numel for p in params if p.block is None)
    blocks = sorted(_by_block(params, [p.numel for p in params]).values())
    if par.zero == 2 or par.pipeline > 1:  # gathered from forward to the end of backward
        state.gathered = compute * (root + sum(blocks))
    else:  # stage 3: the root's, and one block computing while the next is gathered
        state.gathered = compute * (root + sum(blocks[-2:]))
    largest = blocks[-1] if blocks else 0
    if par.microbatches > 1 and (par.no_sync or par.pipeline > 1):
        # no_sync (the pipeline's stages use it too): unsharded gradients accumulate
        state.held = reduce * sum(p.numel for p in train)
        state.communication = reduce * max(largest, root)  # a reduce-scatter's input
    else:  # the root's gradients wait for the end of backward; each block's are copied
        # into a reduce-scatter input when it finishes
        state.communication = compute * root + max((compute + reduce) * largest, reduce * root)
    if par.offload and device_type == "cuda":
        state.offloaded = state.parameters + state.gradients + state.optimizer_state
        state.parameters = state.gradients = state.optimizer_state = 0
        state.optimizer_sizes, state.block_gradients = [], {}
    return state


def _by_block(params: list[Param], sizes: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, n in zip(params, sizes, strict=True):
        if p.block is not None:
            out[p.block] = out.get(p.block, 0) + n
    return out


def loop_temporaries(sizes: list[int]) -> int:
    """The for-loop optimizer's scratch: two temporaries of one parameter's size and
    the previous parameter's, at their largest."""
    return max((2 * n + prev for prev, n in zip([0, *sizes], sizes, strict=False)), default=0)


def optimizer_temporaries(sizes: list[int], cfg: Settings, device_type: str) -> int:
    """Memory the optimizer step allocates and frees, over tensors of `sizes` bytes.

    torch's AdamW: foreach (its default on CUDA) builds the denominator
    sqrt(v) + eps for all parameters at once, one more copy of the trainable
    parameters; the for-loop (its default on CPU) goes one parameter at a time,
    keeping two temporaries and the previous parameter's denominator (measured
    on CPU); the fused kernel and our Triton multi-tensor kernels (`triton`)
    need none. strategies.lamb's LAMB: foreach ("foreach" or "fused") builds the
    denominator and the update u for all parameters (two copies), the loop
    (its "default") one parameter at a time, and gradient clipping scales a copy
    of all the gradients. strategies.lars's LARS: its update d for all parameters
    (foreach) or one parameter at a time. Muon: as AdamW's foreach or loop (its fused
    AdamW half is counted as foreach: Muon's own step is a loop over matrices).
    """
    impl, total = cfg.optimizer_impl, sum(sizes)
    if cfg.optimizer == "lars":  # the update d: all at once (foreach), else one at a time
        return total if impl in ("foreach", "fused") else max(sizes, default=0)
    if cfg.optimizer == "muon":  # Muon's loop (a matrix's update and its bf16 copies at a
        # time) is counted as the AdamW half's figure over every tensor, an upper bound
        impl = "foreach" if impl == "fused" else impl
    if impl == "triton":
        return 0
    if cfg.optimizer == "lamb":
        clip = total if cfg.max_grad_norm > 0 else 0
        if impl in ("foreach", "fused"):
            return clip + 2 * total
        return clip + loop_temporaries(sizes)
    if impl == "default":
        impl = "foreach" if device_type == "cuda" else "for-loop"
    if impl == "foreach":
        return total
    if impl == "fused":
        return 0
    return loop_temporaries(sizes)
