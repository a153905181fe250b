"""The activation side of an estimate: a transformer's term by term, or a traced model's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from training_harness.estimator.facts import ModelFacts
from training_harness.estimator.lm import (
    FIRST_STAGE_TERMS,
    fused_loss_bytes,
    lm_outside_block_terms,
    logits_bytes,
)
from training_harness.estimator.settings import Settings, checkpointed_blocks
from training_harness.estimator.trace import Trace
from training_harness.estimator.transformer import (
    block_activation_terms,
    block_backward_working_bytes,
    block_forward_flops_per_sample,
)
from training_harness.estimator.widths import attention_kind, widths_for
from training_harness.workloads.base import TransformerShape


@dataclass
class ActivationParts:
    """The activation side of an estimate, and what the moments of a step need."""

    memory: dict[str, int]  # activations, other_activations, logits (the working set
    # at the start of backward: the loss's), backward_working (a block's), recompute,
    # autocast_weight_copies
    assumptions: list[str]
    block_terms: dict[str, int] = field(default_factory=dict)
    # Autocast's weight copies live in its cache until forward ends; after that
    # only those saved outside checkpointed blocks stay (None: all of them), and a
    # rebuilt block makes its own again.
    copies_kept: int | None = None
    copies_rebuilt: int = 0
    # Of the kept copies, those each block keeps, freed in its backward (empty: all
    # of them alive through backward, an upper bound).
    block_copies: list[int] = field(default_factory=list)
    # Each block's backward working set (empty: memory["backward_working"] for each).
    block_working: list[int] = field(default_factory=list)
    # Counted from the parameters (2 bytes each), not traced: a rank recounts its own.
    copies_counted: bool = False
    loss_forward: int = 0  # the language-model loss's transient in forward
    # Per block: what it keeps; the checkpointed ones.
    stored: list[int] = field(default_factory=list)
    checkpointed: list[int] = field(default_factory=list)
    recompute_flops_per_sample: float = 0.0
    # Of other_activations, what is kept before the blocks (the first pipeline
    # stage's; the rest is freed by the time backward reaches the blocks); the
    # residual stream a pipeline stage hands on; what the loss keeps of one micro-batch
    # until its backward.
    outside_first: int = 0
    stage_output: int = 0
    loss_saved: int = 0


def transformer_activations(
    shape: TransformerShape,
    lm: bool,
    cfg: Settings,
    facts: ModelFacts,
    device_type: str,
    batch: int,
    trace: Trace | None,
) -> ActivationParts:
    """Activations of a transformer, term by term; outside the blocks a language
    model's terms (`lm`), else the trace's."""
    amp = cfg.amp is not None
    dropout = shape.dropout > 0
    if facts.attention_cores is not None:  # harness cores, which `fused` swaps
        requested = cfg.fused_attention or facts.attention_cores
    else:
        requested = "sdpa" if trace is not None and trace.calls_sdpa else "explicit"
    if cfg.sparse_attention is not None:  # its cores replace any other
        requested = "flex"
    kind = attention_kind(requested, device_type, dropout, cfg.sdpa_backend)
    par = cfg.parallel
    widths = widths_for(amp, device_type, half_params=par.fsdp_mixed)
    terms = block_activation_terms(
        shape,
        batch,
        widths,
        attention=kind,
        dropout=dropout,
        # memory-efficient attention (CUDA's fused kernel for fp32) pads rows to 32
        logsumexp_rows=(
            32 * math.ceil(shape.seq_len / 32) if device_type == "cuda" and not amp else None
        ),
        tensor=par.tensor,
        tensor_mlp=par.tensor_mlp,
    )
    per_block = sum(terms.values())
    ckpt = checkpointed_blocks(shape.layers, cfg.checkpoint_every)
    stored_input = widths.resid * shape.seq_len * batch * shape.hidden
    memory = {
        "activations": len(ckpt) * stored_input + (shape.layers - len(ckpt)) * per_block,
        "backward_working": block_backward_working_bytes(
            terms, shape, batch, widths, kind, par.tensor, par.tensor_mlp
        ),
        # The rebuilt block's tensors; its input (LayerNorm's) is kept already.
        "recompute": per_block - terms["ln1_input"] if ckpt else 0,
    }
    parts = ActivationParts(
        memory=memory,
        assumptions=[],
        block_terms=terms,
        stored=[stored_input if i in ckpt else per_block for i in range(shape.layers)],
        checkpointed=ckpt,
        stage_output=stored_input,
        recompute_flops_per_sample=len(ckpt)
        * block_forward_flops_per_sample(shape, facts.block_parameters),
    )
    sbh = shape.seq_len * batch * shape.hidden
    parts.assumptions += [
        f"Transformer activations per block follow Korthikanti et al. (2022) eq. 1 term "
        f"by term, adapted to what PyTorch keeps on {device_type}: "
        f"{per_block:,} bytes per block ({per_block / sbh:.2f}·s·b·h) with "
        f"{'16-bit' if amp else 'fp32'} activations, "
        f"{'a 16-bit' if widths.resid == 2 else 'an fp32'} residual stream "
        f"(LayerNorm inputs), {kind} attention"
        + (f" and dropout {shape.dropout:g}" if dropout else " and no dropout")
        + "; see block_terms.",
        "The blocks are pre-LayerNorm transformer blocks (LayerNorm, one QKV projection, "
        "attention, output projection; LayerNorm, FC, GELU, FC); tensors that do not "
        "grow with the batch are left out.",
    ]
    if kind == "fused":
        parts.assumptions.append(
            "SDPA runs a fused kernel (flash / memory-efficient / cuDNN), or FlexAttention: "
            "no s² terms, a fp32 log-sum-exp per row and head instead."
        )
    elif kind == "math":
        parts.assumptions.append(
            "SDPA runs its math path (sdpa_backend 'math', or on CPU with dropout), which "
            "keeps fp32 scores."
        )

    if lm:
        outside = lm_outside_block_terms(shape, batch, widths, dropout)
        memory["other_activations"] = sum(outside.values())
        parts.outside_first = sum(outside[k] for k in FIRST_STAGE_TERMS)
        chunked = widths.act if cfg.cross_entropy == "triton" else None
        memory["logits"] = logits_bytes(shape, batch, chunked)
        sbv = batch * shape.seq_len * shape.vocab
        parts.loss_saved = 0 if chunked else 4 * sbv
        parts.loss_forward = memory["logits"] if chunked else (10 if amp else 8) * sbv
        parts.assumptions.append(
            "The language-model loss peaks at 12·b·s·V bytes at the start of backward "
            "(the fp32 log-softmax output and two fp32 gradients of its size)."
            if chunked is None
            else "The chunked Triton cross-entropy holds only the logits, overwritten by "
            "their gradient."
        )
        if cfg.linear_cross_entropy:  # no logits: one chunk's, and the weight's gradient
            chunk, accumulator, rows = fused_loss_bytes(
                shape.vocab, shape.hidden, batch * shape.seq_len, widths.act)
            memory["logits"] = parts.loss_forward = chunk + accumulator
            parts.loss_saved = accumulator
            parts.assumptions[-1] = (
                f"The fused linear cross-entropy (fused linear_cross_entropy) never holds the "
                f"b·s·V logits: one chunk of {rows:,} tokens' logits and their gradient "
                f"({chunk:,} bytes) and the head weight's fp32 gradient ({accumulator:,}) "
                f"at most; the hidden state's gradient, made in forward, is kept in place "
                f"of the head's input."
            )
    else:
        assert trace is not None, "a transformer that is no language model is traced"
        memory["other_activations"] = trace.other_activations
        memory["logits"] = trace.head_working
        parts.outside_first = trace.other_before
        parts.assumptions.append(
            "Outside the blocks (embedding, head, loss) what autograd saves, and the "
            "gradients the head's and loss's backward hold, are traced on fake tensors."
        )
    if trace is not None:
        memory["autocast_weight_copies"] = trace.weight_copies
        parts.copies_kept = trace.weight_copies_kept
        parts.copies_rebuilt = trace.weight_copies_rebuilt
        parts.block_copies = trace.weight_copies_by_block
    elif amp and not par.fsdp_mixed:  # FSDP's 16-bit parameters: autocast casts nothing
        h, f = shape.hidden, shape.ffn_hidden
        block_params = facts.block_parameters or 4 * h * h + 2 * h * f
        count_copies(parts, facts.parameters, block_params, len(ckpt))
        parts.assumptions.append(
            "Autocast's 16-bit weight copies are counted at 2 bytes for every parameter "
            "(an upper bound: norms and position embeddings are not cast)."
        )
    return parts


def traced_activations(trace: Trace, batch: int) -> ActivationParts:
    """Activations of any model, as the trace of its forward pass counted them."""
    return ActivationParts(
        memory={
            "activations": trace.activations,
            "other_activations": trace.other_activations,
            "logits": trace.head_working,
            "recompute": trace.recompute,
            "backward_working": trace.block_working,
            "autocast_weight_copies": trace.weight_copies,
        },
        assumptions=[
            "Activations are counted by tracing one forward pass on fake tensors: what "
            "autograd saves, once per storage, parameters, buffers and autocast weight "
            "copies apart. Backward's working set is read off the traced graph: the "
            "gradients one op's backward receives and makes (after the blocks: the "
            "head's and loss's, at the start of backward; in a block: with the gradient "
            "of the block's output, which its residual connection holds)."
        ],
        outside_first=trace.other_before,
        copies_kept=trace.weight_copies_kept,
        copies_rebuilt=trace.weight_copies_rebuilt,
        block_copies=trace.weight_copies_by_block,
        block_working=trace.working_by_block,
        stored=trace.stored_by_block,
        checkpointed=trace.checkpointed,
        recompute_flops_per_sample=trace.recompute_flops / batch,
    )


def count_copies(parts: ActivationParts, parameters: int, block: int, checkpointed: int) -> None:
    """Autocast's 16-bit copies of `parameters` weights: all of them until forward
    ends; then, with `checkpointed` blocks of `block` parameters, those outside
    them, plus one rebuilt block's."""
    parts.copies_counted = True
    parts.memory["autocast_weight_copies"] = 2 * parameters
    parts.copies_kept = 2 * max(0, parameters - checkpointed * block) if checkpointed else None
    parts.copies_rebuilt = 2 * block if checkpointed else 0
