"""What a language model keeps outside its blocks: token ids, final norm, head, loss."""

from __future__ import annotations

from training_harness.estimator.widths import Widths
from training_harness.workloads.base import TransformerShape

# What the first stage of a pipeline keeps of `lm_outside_block_terms`; the last
# stage keeps the rest.
FIRST_STAGE_TERMS = ("token_ids", "embedding_dropout_mask")


def lm_outside_block_terms(
    shape: TransformerShape, batch: int, widths: Widths, dropout: bool
) -> dict[str, int]:
    """What a GPT keeps outside its blocks, except the loss (see `logits_bytes`):
    the token ids and targets, the embedding dropout's mask, the final LayerNorm's
    input and statistics, the LM head's input."""
    s, b, h = shape.seq_len, batch, shape.hidden
    sbh = s * b * h
    return {
        "token_ids": 8 * s * b,  # int64, kept by the embedding
        "targets": 8 * s * b,  # int64, kept by the loss
        "embedding_dropout_mask": widths.mask_of(widths.resid) * sbh if dropout else 0,
        "final_norm_input": widths.resid * sbh + 2 * widths.stats * s * b,
        "head_input": widths.act * sbh,
    }


def logits_bytes(shape: TransformerShape, batch: int, chunked_width: int | None = None) -> int:
    """The language-model loss at its largest: 12·b·s·V bytes.

    Cross-entropy runs in fp32 (autocast's fp32 list on CPU and CUDA) and keeps
    its log-softmax output (4·bsV). In forward the logits (2 or 4·bsV), their
    fp32 copy under autocast (4·bsV) and the log-softmax live together: 8 to
    10·bsV. At the start of backward the log-softmax output, the gradient
    nll_loss hands back and the one log-softmax's backward makes are all fp32
    and alive together: 12·bsV, the larger.

    kernels.cross_entropy's chunked Triton kernel (fused cross_entropy =
    'triton') holds no log-probabilities: it writes the gradient over the
    logits, in their dtype (`chunked_width` bytes), and scales it in place.
    """
    if chunked_width is not None:
        return chunked_width * batch * shape.seq_len * shape.vocab
    return 12 * batch * shape.seq_len * shape.vocab


def fused_loss_bytes(vocab: int, hidden: int, tokens: int, act_width: int) -> tuple[int, int, int]:
    """The fused linear cross-entropy's working set (fused linear_cross_entropy): (one
    chunk's bytes, the weight gradient's accumulator, rows per chunk).

    kernels.linear_cross_entropy makes the logits `rows` tokens at a time: a chunk holds
    its fp32 logits, turned in place into their gradient, and under a 16-bit dtype that
    gradient's copy for the matmuls (the 16-bit logits before the fp32 copy are the
    same size, and freed first): rows·V·(4 + 2). Beside them, for the whole forward,
    the head weight's fp32 gradient (4·V·H), kept until backward scales it; the hidden
    state's gradient, of the head input's size, is kept in place of the head's input.
    """
    from training_harness.strategies.kernel_swaps import chunk_rows

    rows = chunk_rows(vocab, tokens)
    chunk = rows * vocab * (4 + (act_width if act_width < 4 else 0))
    return chunk, 4 * vocab * hidden, rows
