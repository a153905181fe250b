"""LayerNorm over the last dimension: Triton forward and backward, reference, module.

Forward: one program per row; the row (up to MAX_N elements) sits in registers,
mean and 1/std are computed in fp32 whatever the input dtype and kept (2 floats a
row) for the backward. Backward: dx row by row as in the forward; dweight and
dbias are sums over rows, done in two steps: each of G programs walks its slice
of rows accumulating in fp32 registers and writes one partial row, then torch
sums the G partials (G is a few per SM, so this costs ~G·N floats).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.kernels.dispatch import cdiv, jit, next_power_of_2, resolve

tl = None  # triton.language, bound by dispatch.jit at the first launch (kernels/dispatch.py)

MAX_N = 16384  # the widest row kept in registers; wider rows take the reference
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@jit
def _ln_fwd(X, Y, W, B, Mean, Rstd, N, eps,
            HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)


@jit
def _ln_bwd(X, DY, DX, W, Mean, Rstd, DW_part, DB_part, M, N, rows_per_program,
            HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    if HAS_W:  # noqa: SIM108 (a static if, resolved when the kernel is compiled)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        w = 1.0
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for i in range(0, row_end - row_start):
        row = row_start + i  # int64 (a plain int loop variable would not be in the interpreter)
        offs = row * N + cols
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    if HAS_W:
        tl.store(DW_part + pid * N + cols, dw, mask=mask)
    if HAS_B:
        tl.store(DB_part + pid * N + cols, db, mask=mask)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _num_warps(block_n: int) -> int:
    return min(max(block_n // 256, 1), 8)


class LayerNormFunction(torch.autograd.Function):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim; weight, bias optional."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        n = x.shape[-1]
        x2 = x.reshape(-1, n).contiguous()
        m = x2.shape[0]
        y = torch.empty_like(x2)
        mean = torch.empty(m, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        block_n = next_power_of_2(n)
        if m:
            _ln_fwd[(m,)](
                x2, y, x2 if weight is None else weight, x2 if bias is None else bias,
                mean, rstd, n, eps, HAS_W=weight is not None, HAS_B=bias is not None,
                BLOCK_N=block_n, num_warps=_num_warps(block_n),
            )
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = dy.reshape(-1, n).contiguous()
        dx = torch.empty_like(x2)
        sms = _sm_count(x2.device) if x2.is_cuda else 2
        g = max(1, min(m, 4 * sms))
        rows_per_program = cdiv(m, g) if m else 1
        g = cdiv(m, rows_per_program) if m else 0
        f32 = dict(dtype=torch.float32, device=x2.device)
        dw_part = torch.empty((g, n), **f32) if weight is not None else None
        db_part = torch.empty((g, n), **f32) if bias is not None else None
        block_n = next_power_of_2(n)
        if m:
            _ln_bwd[(g,)](
                x2, dy2, dx, x2 if weight is None else weight, mean, rstd,
                x2 if dw_part is None else dw_part, x2 if db_part is None else db_part,
                m, n, rows_per_program, HAS_W=weight is not None, HAS_B=bias is not None,
                BLOCK_N=block_n, num_warps=_num_warps(block_n),
            )
        need = ctx.needs_input_grad
        dw = dw_part.sum(0).to(weight.dtype) if weight is not None and need[1] else None
        db = db_part.sum(0).to(bias.dtype) if bias is not None and need[2] else None
        return dx.view(ctx.x_shape) if need[0] else None, dw, db, None


def layer_norm_reference(x, weight=None, bias=None, eps=1e-5):
    """Plain PyTorch: F.layer_norm over the last dim, computed in fp32 (fp64 for fp64 inputs)
    and cast back to x's dtype."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    up = lambda t: None if t is None else t.to(acc)
    return F.layer_norm(up(x), (x.shape[-1],), up(weight), up(bias), eps).to(x.dtype)


def _supported(x, weight, bias) -> bool:
    n = x.shape[-1] if x.dim() else 0
    return (
        x.dtype in DTYPES and 0 < n <= MAX_N
        and all(t is None or (t.shape == (n,) and t.device == x.device) for t in (weight, bias))
    )


def layer_norm(x, weight=None, bias=None, eps=1e-5, impl="auto"):
    """LayerNorm over the last dim. impl: "auto" (Triton where `kernels.use_triton(x)`,
    and for fp32/fp16/bf16 rows up to MAX_N wide), "triton" or "reference"."""
    if resolve(impl, x, _supported(x, weight, bias)):
        return LayerNormFunction.apply(x, weight, bias, eps)
    return layer_norm_reference(x, weight, bias, eps)


class FusedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose forward runs `layer_norm` (same parameters and state dict).

    A multi-dimensional normalized_shape is flattened into one last dimension.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None, impl="auto"):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self.impl = impl

    @classmethod
    def from_layernorm(cls, ln: nn.LayerNorm, impl: str = "auto") -> FusedLayerNorm:
        """A FusedLayerNorm sharing `ln`'s parameters (the same Parameter objects)."""
        new = cls(ln.normalized_shape, ln.eps, ln.elementwise_affine, ln.bias is not None,
                  device="meta", impl=impl)
        new.weight, new.bias = ln.weight, ln.bias
        return new.train(ln.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = len(self.normalized_shape)
        if tuple(x.shape[-k:]) != tuple(self.normalized_shape):
            return super().forward(x)  # torch's own error message
        n = math.prod(self.normalized_shape)
        flat = lambda t: None if t is None else t.reshape(n)
        y = layer_norm(x.reshape(*x.shape[:-k], n), flat(self.weight), flat(self.bias),
                       self.eps, self.impl)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, impl={self.impl!r}"
