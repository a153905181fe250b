"""Softmax cross-entropy for large vocabularies, chunked over V, gradient made in the forward.

One program per row of logits (N, V). Pass 1 walks the row in BLOCK_V chunks
keeping a running max m and a running sum d of exp(x - m) (the online
log-sum-exp), so lse = m + log d; loss = lse - x[target]. Pass 2 walks the row
again and writes the gradient (softmax - onehot(target)), times 1/n_valid for
reduction="mean", rows with target == ignore_index getting 0. The backward only
scales that stored gradient by grad_output. No N x V probability matrix is ever
held: the kernel reads the logits twice and writes the gradient once.

In place (inplace=True, the default, as in Liger-Kernel): when the logits need a
gradient and are not a leaf, the gradient is written over the logits themselves,
so training holds one N x V tensor instead of two. The logits then no longer hold
logits after the loss is computed: do not read them afterwards (for an accuracy,
a second loss, logging) and do not let another op save them for its backward.
Triton's write does not bump the tensor's version counter, so autograd cannot
catch such a misuse. A view of a bigger tensor (logits.view(-1, V)) is written
through to it. inplace=False writes the gradient to a new buffer instead. Without
a gradient to compute (torch.no_grad, logits not requiring grad) nothing is written.
The stored gradient is scaled in place during backward, so backward runs once
(retain_graph=True and a second backward is refused).

The loss is fp32 for fp32/bf16/fp16 logits (as under autocast); the gradient has
the logits' dtype. Targets must lie in [0, V) or equal ignore_index (not checked
on the Triton path: checking would cost a device sync).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.kernels.dispatch import jit, next_power_of_2, resolve

tl = None  # triton.language, bound by dispatch.jit at the first launch (kernels/dispatch.py)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REDUCTIONS = ("mean", "sum", "none")
MAX_BLOCK_V = 8192  # the chunk over the vocabulary (a power of 2)


@jit
def _ce_kernel(Logits, Targets, Grad, Loss, NValid, V, ignore_index,
               MEAN: tl.constexpr, COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = Logits + row * V
    target = tl.load(Targets + row)
    valid = target != ignore_index
    # pass 1: online max and sum of exp over the chunks
    m = float("-inf")
    d = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(d)
    x_target = tl.load(x_row + target, mask=valid, other=0.0).to(tl.float32)
    tl.store(Loss + row, tl.where(valid, lse - x_target, 0.0))
    # pass 2: the gradient softmax - onehot, scaled; may overwrite the logits chunk by chunk
    if COMPUTE_GRAD:
        scale = 1.0
        if MEAN:
            scale = 1.0 / tl.load(NValid).to(tl.float32)
        scale = tl.where(valid, scale, 0.0)
        g_row = Grad + row * V
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(x_row + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
            tl.store(g_row + cols, g.to(Grad.dtype.element_ty), mask=cols < V)


class CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy of logits (N, V) against targets (N,); see the module docstring."""

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction, compute_grad, inplace):
        n, v = logits.shape
        x = logits.contiguous()
        targets = targets.contiguous()
        loss = torch.empty(n, dtype=torch.float32, device=x.device)
        n_valid = (targets != ignore_index).sum()
        grad = None
        if compute_grad:
            # a copy made by .contiguous() is ours to overwrite whatever `inplace` says
            grad = x if inplace or x is not logits else torch.empty_like(x)
        if n:
            block_v = min(next_power_of_2(v), MAX_BLOCK_V)
            _ce_kernel[(n,)](
                x, targets, x if grad is None else grad, loss, n_valid, v, ignore_index,
                MEAN=reduction == "mean", COMPUTE_GRAD=compute_grad, BLOCK_V=block_v,
                num_warps=8 if block_v >= 4096 else 4,
            )
        ctx.reduction, ctx.done = reduction, False
        if grad is not None:
            ctx.save_for_backward(grad.detach())
        if reduction == "none":
            return loss
        return loss.sum() / n_valid if reduction == "mean" else loss.sum()

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.done:
            raise RuntimeError(
                "kernels.cross_entropy: backward ran twice; the stored gradient is scaled "
                "in place, so use retain_graph only with the reference implementation"
            )
        ctx.done = True
        (grad,) = ctx.saved_tensors
        scale = grad_output[:, None] if ctx.reduction == "none" else grad_output
        return grad.mul_(scale.to(grad.dtype)), None, None, None, None, None


def cross_entropy_reference(logits, targets, ignore_index=-100, reduction="mean"):
    """Plain PyTorch: F.cross_entropy in fp32 (fp64 for fp64 logits). It holds the
    N x V log-probabilities, which the Triton path avoids."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return F.cross_entropy(logits.to(acc), targets, ignore_index=ignore_index, reduction=reduction)


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")


def _supported(logits, targets) -> bool:
    return (
        logits.dim() == 2 and logits.dtype in DTYPES and logits.shape[1] > 0
        and targets.shape == logits.shape[:1] and targets.device == logits.device
        and not targets.is_floating_point()
    )


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean", inplace=True,
                  impl="auto"):
    """Mean/sum/none cross-entropy of `logits` (N, V) against class indices `targets` (N,).

    inplace=True lets the Triton path overwrite `logits` with their gradient (see the
    module docstring); a leaf tensor is never overwritten. impl: "auto" (Triton where
    `kernels.use_triton(logits)`), "triton" or "reference".
    """
    _check_reduction(reduction)
    if not resolve(impl, logits, _supported(logits, targets)):
        return cross_entropy_reference(logits, targets, ignore_index, reduction)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    inplace = inplace and not logits.is_leaf
    return CrossEntropyFunction.apply(
        logits, targets, ignore_index, reduction, compute_grad, inplace
    )


class ChunkedCrossEntropy(nn.Module):
    """criterion(logits (N, V), targets (N,)): `cross_entropy` as a loss module."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 inplace: bool = True, impl: str = "auto"):
        super().__init__()
        _check_reduction(reduction)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.inplace, self.impl = inplace, impl

    @classmethod
    def from_loss(cls, loss: nn.CrossEntropyLoss, inplace: bool = True,
                  impl: str = "auto") -> ChunkedCrossEntropy:
        """The same loss as `loss`, which must have no class weights nor label smoothing."""
        if loss.weight is not None or loss.label_smoothing:
            raise ValueError("ChunkedCrossEntropy has neither class weights nor label smoothing")
        return cls(loss.ignore_index, loss.reduction, inplace, impl)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets, self.ignore_index, self.reduction,
                             self.inplace, self.impl)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"inplace={self.inplace}, impl={self.impl!r}")
