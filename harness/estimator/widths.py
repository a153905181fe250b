"""Bytes per element of what a transformer block saves, by device and precision."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Widths:
    """Bytes per element of each kind of tensor a transformer block saves.

    act     matmul inputs, GELU input and output, Q/K/V, attention output:
            2 under autocast, 4 in fp32.
    resid   the residual stream: LayerNorm inputs and checkpointed block inputs.
            It stays fp32 under autocast (embeddings are fp32, and fp32 + bf16
            adds promote to fp32), so 4 in both cases.
    softmax the attention probabilities softmax saves: CUDA autocast runs
            softmax in fp32 (4); CPU autocast leaves it in bf16 (2).
    mask    a dropout mask element: 1 on CUDA (native_dropout's bool mask);
            None where the mask has the dropped tensor's own dtype (CPU dropout
            multiplies by a noise tensor of the input's dtype).
    stats   each of LayerNorm's two per-row statistics (mean, rstd): 4 (fp32).
    """

    act: int
    resid: int
    softmax: int
    mask: int | None
    stats: int

    def mask_of(self, width: int) -> int:
        return width if self.mask is None else self.mask


# The paper's setting: every activation 16-bit, 1-byte masks, statistics left out.
PAPER = Widths(act=2, resid=2, softmax=2, mask=1, stats=0)


def widths_for(amp: bool, device_type: str, half_params: bool = False) -> Widths:
    """What PyTorch keeps with (amp) or without autocast on `device_type`.

    `half_params`: the parameters themselves are 16-bit while they compute
    (FSDP's mixed precision), so the embeddings and with them the residual
    stream are too. CUDA autocast still hands LayerNorm an fp32 copy (kept: 4
    bytes); CPU autocast does not (2).
    """
    act = 2 if amp else 4
    if device_type == "cuda":
        return Widths(act=act, resid=4, softmax=4, mask=1, stats=4)
    return Widths(act=act, resid=2 if half_params else 4, softmax=act, mask=None, stats=4)


def attention_kind(requested: str, device_type: str, dropout: bool,
                   backend: str = "auto") -> str:
    """'explicit', 'fused' (flash / memory-efficient / cuDNN SDPA, FlexAttention) or
    'math' (SDPA's math backend).

    On CPU, SDPA's flash kernel takes no dropout: with dropout torch runs the
    math path, which materialises the scores in fp32. `fused`'s sdpa_backend = 'math'
    asks for that path everywhere (it computes 16-bit inputs in fp32 too); flex and the
    sparse pattern run FlexAttention (or, on the CPU, flash SDPA with a mask).
    """
    if requested == "explicit":
        return "explicit"
    if requested == "flex":
        return "fused"
    if backend == "math":
        return "math"
    if device_type == "cpu" and dropout:
        return "math"
    return "fused"
