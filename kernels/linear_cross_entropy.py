"""Fused linear cross-entropy: the LM head's matmul and the softmax cross-entropy in one
function, over chunks of tokens, never holding the (tokens x vocab) logits.

    loss = mean over rows i with targets[i] != ignore_index of
           logsumexp(h_i W^T + b) - (h_i W^T + b)[targets[i]]

The approach of Liger Kernel's FusedLinearCrossEntropy and Apple's cut-cross-entropy,
in plain PyTorch (it runs on the CPU and on a GPU). The forward walks the rows
(tokens) in chunks; for each chunk it computes the chunk's logits (the matmul in the
input dtype, the rest in fp32), their log-sum-exp and the chunk's loss, and at once
the gradient of the mean loss w.r.t. the chunk's logits, (softmax - onehot(target)) /
n_valid (0 on ignored rows), which it turns into the chunk's rows of the gradient
w.r.t. the hidden state (g W) and adds to the gradient w.r.t. the weight (g^T h, fp32
accumulator) and bias (sum of g). The chunk's logits are then freed. What is kept for
backward is those gradients: tokens x hidden and vocab x hidden, never tokens x vocab;
the backward scales them by grad_output (in place, so it runs once: retain_graph and a
second backward are refused). ignore_index is handled as F.cross_entropy's
reduction="mean" does: the mean over the non-ignored rows (NaN when there are none, as
torch's; the gradient is then 0).

Under autocast the hidden state, weight and bias are cast to autocast's dtype first (as
the nn.Linear head would be), and the function runs with autocast off: its matmuls in
that dtype, its softmax and loss in fp32. The loss is fp32; the gradients have the
inputs' dtypes. Without a gradient to compute (torch.no_grad, nothing requiring grad)
only the loss is computed.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

# A chunk holds its fp32 logits (rows x V x 4 bytes), turned in place into their
# gradient, plus that gradient's copy in the input dtype (2 more bytes under bf16): the
# loss's working set is about 1.5 x CHUNK_LOGITS_BYTES, whatever the batch. 256 MiB is
# ~1,300 rows of GPT-2's 50,304-word vocabulary: each chunk's three matmuls
# (rows x hidden x V, ~100 GFLOP at hidden 768) stay large enough to run at the GPU's
# matmul speed and the ~10 launches a chunk costs are noise beside them (52 chunks for
# 64 x 1024 tokens), while the plain loss's 12 bytes x tokens x V (39.5 GB there) shrink
# to ~0.4 GB. Smaller chunks would save little more and launch more; larger ones only
# spend memory (Liger picks about tokens x hidden elements per chunk: similar here).
CHUNK_LOGITS_BYTES = 256 * 2**20
ALIGN = 64  # rows per chunk rounded down to a multiple of this (tensor-core tiles)


def chunk_rows(vocab: int, rows: int | None = None) -> int:
    """Rows per chunk: as many as keep one chunk's fp32 logits within CHUNK_LOGITS_BYTES
    (a multiple of ALIGN when that is 64 or more), at most `rows` when given."""
    n = max(1, CHUNK_LOGITS_BYTES // (4 * max(1, vocab)))
    if n >= ALIGN:
        n -= n % ALIGN
    return n if rows is None else max(1, min(n, rows))


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Mean cross-entropy of hidden (N, H) @ weight (V, H)^T + bias (V,) against targets
    (N,); see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index, rows, needs):
        n, width = hidden.shape
        vocab = weight.shape[0]
        valid_all = targets != ignore_index
        n_valid = valid_all.sum()
        # 1 / n_valid for the gradient; 0 rows: a zero gradient (the loss is NaN, as torch's)
        inv = 1.0 / n_valid.clamp(min=1).to(torch.float32)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        need_h, need_w, need_b = needs
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(vocab, width, dtype=torch.float32, device=hidden.device) \
            if need_w else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) \
            if need_b else None
        for start in range(0, n, rows):
            end = min(start + rows, n)
            x, y, valid = hidden[start:end], targets[start:end], valid_all[start:end]
            logits = F.linear(x, weight, bias).float()  # the matmul in the input dtype
            lse = torch.logsumexp(logits, dim=-1)
            safe = y.masked_fill(~valid, 0)  # an index for ignored rows; weighted 0 below
            picked = logits.gather(1, safe[:, None]).squeeze(1)
            total += torch.where(valid, lse - picked, 0.0).sum()
            if not (need_h or need_w or need_b):
                continue
            g = logits.sub_(lse[:, None]).exp_()  # softmax, over the logits
            g.scatter_add_(1, safe[:, None], -valid[:, None].to(g.dtype))  # minus onehot
            g.mul_((valid.to(g.dtype) * inv)[:, None])  # d(mean loss)/d(logits)
            if grad_b is not None:
                grad_b += g.sum(0)
            g = g.to(hidden.dtype)
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[start:end])
            if grad_w is not None:
                if x.dtype == torch.float32:
                    grad_w.addmm_(g.t(), x)
                else:  # the matmul in the input dtype, summed over chunks in fp32
                    grad_w += g.t() @ x
            del logits, g
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        ctx.done = False
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        return total / n_valid

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.done:
            raise RuntimeError(
                "kernels.linear_cross_entropy: backward ran twice; the gradients made in "
                "forward are scaled in place, so retain_graph cannot be used with it"
            )
        ctx.done = True
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        if grad_h is not None:
            grad_h = grad_h.mul_(grad_output.to(grad_h.dtype))
        if grad_w is not None:
            grad_w = grad_w.mul_(grad_output).to(w_dtype)
        if grad_b is not None:
            grad_b = grad_b.mul_(grad_output).to(b_dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    try:
        on = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device autocast does not know (meta)
        return None
    return torch.get_autocast_dtype(device_type) if on else None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of `hidden` (N, H) @ `weight` (V, H)^T (+ `bias` (V,)) against
    class indices `targets` (N,), rows whose target is `ignore_index` left out; the
    logits are made `rows` rows at a time (default: `chunk_rows(V)`), never all at once."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_cross_entropy: hidden (N, H) and weight (V, H), got "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"linear_cross_entropy: targets (N,) for hidden {tuple(hidden.shape)}, "
                         f"got {tuple(targets.shape)}")
    device_type = hidden.device.type
    dtype = _autocast_dtype(device_type)
    off = contextlib.nullcontext()
    if dtype is not None:  # as autocast would run the head's nn.Linear
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        off = torch.autocast(device_type, enabled=False)
    grad = torch.is_grad_enabled()
    needs = (grad and hidden.requires_grad, grad and weight.requires_grad,
             grad and bias is not None and bias.requires_grad)
    with off:
        return LinearCrossEntropyFunction.apply(
            hidden.contiguous(), weight, bias, targets.contiguous(), ignore_index,
            chunk_rows(weight.shape[0], rows), needs)


class LinearCrossEntropy(nn.Module):
    """criterion(hidden (N, H), weight (V, H), targets (N,), bias=None) -> the mean loss:
    `linear_cross_entropy` as a loss module. A model whose criterion says `fuses_head`
    hands it the head's input and weight instead of the logits (workloads.gpt)."""

    fuses_head = True

    def __init__(self, ignore_index: int = -100, rows: int | None = None):
        super().__init__()
        self.ignore_index, self.rows = ignore_index, rows

    @classmethod
    def from_loss(cls, loss: nn.CrossEntropyLoss, rows: int | None = None) -> LinearCrossEntropy:
        """The same loss as `loss` (reduction mean, no class weights, no label smoothing)."""
        if loss.weight is not None or loss.label_smoothing or loss.reduction != "mean":
            raise ValueError("LinearCrossEntropy is the mean loss, without class weights or "
                             "label smoothing")
        return cls(loss.ignore_index, rows)

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, targets, bias, self.ignore_index,
                                    self.rows)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, rows={self.rows}"
