"""One transformer block's saved tensors, term by term (Korthikanti et al. 2022)."""

from __future__ import annotations

from training_harness.estimator.widths import Widths
from training_harness.workloads.base import TransformerShape


def block_activation_terms(
    shape: TransformerShape,
    batch: int,
    widths: Widths,
    attention: str = "explicit",
    dropout: bool = False,
    logsumexp_rows: int | None = None,
    tensor: int = 1,
    tensor_mlp: bool = True,
) -> dict[str, int]:
    """Bytes one pre-LayerNorm GPT block keeps for backward, by term.

    s sequence, b micro-batch, h hidden, a heads, f FFN hidden; w.x the widths.
    Korthikanti et al. (2022) eq. 1 counts, with 16-bit activations and 1-byte
    dropout masks, s·b·h·(34 + 5·a·s/h) bytes:

        attention  11·sbh + 5·as²b
          LayerNorm input            2 sbh
          QKV projection input       2 sbh
          Q and K (for QKᵀ)          4 sbh
          softmax output             2 as²b
          softmax dropout mask         as²b
          dropout output (for ·V)    2 as²b
          V                          2 sbh
          output projection input    2 sbh
          residual dropout mask        sbh
        MLP        19·sbh
          LayerNorm input            2 sbh
          FC1 input                  2 sbh
          GELU input                 8 sbh    (2·s·b·f, f = 4h)
          FC2 input (GELU output)    8 sbh
          dropout mask                 sbh

    What torch keeps differs, and each term below says how:

    - LayerNorm inputs are the residual stream, fp32 under autocast: w.resid
      (4), not 2, and LayerNorm also keeps mean and rstd (2·4·s·b bytes).
    - Without dropout the two masks and the softmax-dropout output go: the
      ·V matmul reads the softmax output itself, when it has the matmul's dtype.
      16-bit, no dropout: 32·sbh + 2·as²b.
    - CUDA autocast computes softmax in fp32: its output is 4·as²b and the ·V
      matmul keeps its own bf16 copy (2·as²b), dropout or not.
    - CPU dropout keeps a mask in the dropped tensor's dtype, not a bool.
    - fp32 activations: every 2-byte term is 4 bytes; masks stay 1 (CUDA).
    - Q, K and V are strided views of the QKV output: the explicit matmuls
      keep contiguous copies (2+2+2 sbh at 16-bit); the QKV output itself is
      not kept.
    - Fused SDPA (flash / memory-efficient) keeps no s² term: it keeps Q, K, V
      (the QKV output, 6 sbh at 16-bit), its output (2 sbh) and a fp32
      log-sum-exp per row and head (4·a·s·b). The kernels (CUDA flash and
      memory-efficient, CPU flash) lay their output out as (b, s, a, d), so
      the output projection's input, `y.transpose(1, 2).contiguous()`, is that
      same tensor (measured on CPU): the projection keeps nothing more.
    - SDPA's math fallback ('math', CPU with dropout) computes attention in fp32:
      Q, K, V copies, softmax, mask and dropout output are all 4 bytes.

    Tensors that do not grow with the batch (a causal mask, position ids) are
    left out. Under tensor parallel over `tensor` ranks the terms inside the
    split divide by t (`TENSOR_SPLIT`; the MLP's only with `tensor_mlp`).
    """
    s, b, h, a, f = shape.seq_len, batch, shape.hidden, shape.heads, shape.ffn_hidden
    w = widths
    sbh, as2b = s * b * h, a * s * s * b
    t: dict[str, int] = {}
    t["ln1_input"] = w.resid * sbh
    t["ln1_stats"] = 2 * w.stats * s * b
    t["qkv_input"] = w.act * sbh
    if attention in ("explicit", "math"):
        core = w.act if attention == "explicit" else 4
        soft = w.softmax if attention == "explicit" else 4
        t["q_and_k"] = 2 * core * sbh
        t["softmax_output"] = soft * as2b
        t["attention_dropout_mask"] = w.mask_of(soft) * as2b if dropout else 0
        # The ·V matmul's input: the dropout output, or a cast of the softmax
        # output, or (same dtype, no dropout) the softmax output itself.
        t["probs_for_v"] = core * as2b if dropout or soft != core else 0
        t["v"] = core * sbh
        t["proj_input"] = w.act * sbh
    elif attention == "fused":
        rows = s if logsumexp_rows is None else logsumexp_rows
        t["qkv_output"] = 3 * w.act * sbh
        t["attention_output"] = w.act * sbh
        t["logsumexp"] = 4 * a * rows * b
        t["proj_input"] = 0  # the attention output itself (see above)
    else:
        raise ValueError(f"attention {attention!r}: 'explicit', 'fused' or 'math'")
    t["residual_dropout_mask"] = w.mask_of(w.act) * sbh if dropout else 0
    t["ln2_input"] = w.resid * sbh
    t["ln2_stats"] = 2 * w.stats * s * b
    t["fc1_input"] = w.act * sbh
    t["gelu_input"] = w.act * s * b * f
    t["fc2_input"] = w.act * s * b * f
    t["mlp_dropout_mask"] = w.mask_of(w.act) * sbh if dropout else 0
    return split_by_tensor(t, tensor, tensor_mlp)


# The terms tensor parallel divides (Korthikanti et al. 2022, section 4.2.1): each
# rank computes its own heads and its slice of the MLP's hidden units. The
# LayerNorm inputs and statistics, the QKV and FC1 inputs (the whole residual
# stream, replicated) and the dropout masks after attention and MLP stay whole.
TENSOR_SPLIT = {
    "attention": ("q_and_k", "softmax_output", "attention_dropout_mask", "probs_for_v", "v",
                  "proj_input", "qkv_output", "attention_output", "logsumexp"),
    "mlp": ("gelu_input", "fc2_input"),
}


def split_by_tensor(terms: dict[str, int], tensor: int, mlp: bool = True) -> dict[str, int]:
    """`terms` on tensor rank 0 of `tensor`: the split ones divided (rounded up)."""
    split = TENSOR_SPLIT["attention"] + (TENSOR_SPLIT["mlp"] if mlp else ())
    return {k: -(-v // tensor) if k in split else v for k, v in terms.items()}


def block_backward_working_bytes(
    terms: dict[str, int],
    shape: TransformerShape,
    batch: int,
    widths: Widths,
    attention: str,
    tensor: int = 1,
    tensor_mlp: bool = True,
) -> int:
    """The most one block's backward holds beyond the tensors it saved (`terms`).

    The gradient of the residual stream (fp32, 4·s·b·h) is live throughout. On
    top of it, either GELU's backward: the gradients of its output and input (two
    s·b·f tensors) once FC2's saved input is freed, one s·b·f net; or, for
    explicit attention, softmax's backward: the gradients of its output and
    input (two a·s²·b tensors in the softmax dtype), by when the MLP's saved
    tensors, the output projection's input, V and the ·V input are freed. Tensor
    parallel divides both the s·b·f and the a·s²·b tensors by its ranks.
    """
    s, b, h, a, f = shape.seq_len, batch, shape.hidden, shape.heads, shape.ffn_hidden
    mlp = -(-widths.act * s * b * f // (tensor if tensor_mlp else 1))
    attn = 0
    if attention != "fused":
        soft = 4 if attention == "math" else widths.softmax
        freed = sum(
            terms.get(k, 0)
            for k in (
                "ln2_input", "ln2_stats", "fc1_input", "gelu_input", "fc2_input",
                "mlp_dropout_mask", "residual_dropout_mask", "proj_input", "v", "probs_for_v",
            )
        )
        attn = -(-2 * soft * a * s * s * b // tensor) - freed
    return 4 * s * b * h + max(mlp, attn, 0)


def korthikanti_bytes(shape: TransformerShape, batch: int, tensor: int = 1) -> int:
    """The paper's eq. 1 for one block, s·b·h·(34 + 5·a·s/h) bytes; under tensor
    parallel over t ranks (no sequence parallel) eq. 2, s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    s, b, h, a = shape.seq_len, batch, shape.hidden, shape.heads
    if tensor == 1:
        return 34 * s * b * h + 5 * a * s * s * b
    return 10 * s * b * h + (24 * s * b * h + 5 * a * s * s * b) // tensor


def block_forward_flops_per_sample(shape: TransformerShape, block_parameters: int | None) -> float:
    """Forward FLOPs of one block for one sample: 2·N_block + 4·h·s per token."""
    s, h, f = shape.seq_len, shape.hidden, shape.ffn_hidden
    n = block_parameters if block_parameters is not None else 4 * h * h + 2 * h * f
    return s * (2 * n + 4 * h * s)
