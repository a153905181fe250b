"""y = gelu(x + bias): Triton forward and backward, reference, and LinearBiasGELU.

Both kernels work on (BLOCK_M x BLOCK_N) tiles of x viewed as (M, N), N = bias size,
computing in fp32. The forward reads x and bias and writes y: the sum x + bias is
never stored. The backward reads x, bias and dy, writes dx and, per tile row, the
column sums of dx (the bias gradient) as an fp32 partial; torch sums the
cdiv(M, BLOCK_M) partials.

GELU, with Phi the normal CDF:
    "none":  gelu(z) = z * Phi(z),  Phi(z) = (1 + erf(z / sqrt 2)) / 2
    "tanh":  gelu(z) = z * (1 + tanh(a)) / 2 = z * sigmoid(2a),  a = sqrt(2/pi) (z + 0.044715 z^3)
The sigmoid form is the same function without tanh's cancellation near 1 + tanh = 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.kernels.dispatch import cdiv, jit, next_power_of_2, resolve

tl = None  # triton.language, bound by dispatch.jit at the first launch (kernels/dispatch.py)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
APPROXIMATE = ("none", "tanh")
BLOCK_M, MAX_BLOCK_N = 64, 64


@jit
def _bias_gelu_kernel(X, B, DY, OUT, DB_part, M, N, TANH: tl.constexpr, BACKWARD: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Forward: OUT = gelu(X + B).
    Backward: OUT = DY * gelu'(X + B), and DB_part[pid_m] = the tile's column sums of OUT."""
    pid_m = tl.program_id(0)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    offs = rows[:, None] * N + cols[None, :]
    z = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    z = z + tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if TANH:
        s = tl.sigmoid(1.5957691216057308 * (z + 0.044715 * z * z * z))  # sigmoid(2a)
        if BACKWARD:
            da = 1.5957691216057308 * (1.0 + 0.134145 * z * z)  # d(2a)/dz
            grad = s + z * s * (1.0 - s) * da
        else:
            out = z * s
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        if BACKWARD:
            grad = cdf + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)  # Phi + z * pdf
        else:
            out = z * cdf
    if BACKWARD:
        out = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32) * grad
        tl.store(DB_part + pid_m * N + cols, tl.sum(out, axis=0), mask=col_ok)
    tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)


def _launch(x2, bias, dy2, out, approximate, backward):
    m, n = x2.shape
    block_n = min(next_power_of_2(n), MAX_BLOCK_N)
    grid_m = cdiv(m, BLOCK_M)
    part = torch.empty((grid_m, n), dtype=torch.float32, device=x2.device) if backward else None
    if m:
        _bias_gelu_kernel[(grid_m, cdiv(n, block_n))](
            x2, bias, x2 if dy2 is None else dy2, out, x2 if part is None else part, m, n,
            TANH=approximate == "tanh", BACKWARD=backward, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
        )
    return part


class BiasGELUFunction(torch.autograd.Function):
    """gelu(x + bias), bias over the last dim of x; output in x's dtype."""

    @staticmethod
    def forward(ctx, x, bias, approximate):
        x2 = x.reshape(-1, bias.numel()).contiguous()
        y = torch.empty_like(x2)
        _launch(x2, bias, None, y, approximate, backward=False)
        ctx.save_for_backward(x2, bias)
        ctx.approximate, ctx.x_shape = approximate, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, bias = ctx.saved_tensors
        dx = torch.empty_like(x2)
        part = _launch(x2, bias, dy.reshape(x2.shape).contiguous(), dx, ctx.approximate, True)
        db = part.sum(0).to(bias.dtype) if ctx.needs_input_grad[1] else None
        return dx.view(ctx.x_shape), db, None


def bias_gelu_reference(x, bias, approximate="none"):
    """Plain PyTorch, what an unfused model runs: F.gelu(x + bias)."""
    return F.gelu(x + bias, approximate=approximate)


def _supported(x, bias) -> bool:
    return (
        x.dtype in DTYPES and bias.dim() == 1 and x.dim() >= 1
        and x.shape[-1] == bias.numel() > 0 and bias.device == x.device
    )


def bias_gelu(x, bias, approximate="none", impl="auto"):
    """gelu(x + bias) with GELU `approximate` "none" (erf) or "tanh", as in F.gelu.
    impl: "auto" (Triton where `kernels.use_triton(x)`), "triton" or "reference"."""
    if approximate not in APPROXIMATE:
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    if resolve(impl, x, _supported(x, bias)):
        return BiasGELUFunction.apply(x, bias, approximate)
    return bias_gelu_reference(x, bias, approximate)


class LinearBiasGELU(nn.Module):
    """gelu(x @ weight.T + bias) with the bias add fused into the GELU.

    Holds `weight` and `bias` exactly as nn.Linear does (same names, shapes, init),
    so state dicts and optimizer state are unchanged by the swap.
    """

    def __init__(self, in_features: int, out_features: int, approximate: str = "none",
                 device=None, dtype=None, impl: str = "auto"):
        super().__init__()
        if approximate not in APPROXIMATE:
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        self.in_features, self.out_features = in_features, out_features
        self.approximate, self.impl = approximate, impl
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.Linear.reset_parameters(self)  # type: ignore[arg-type]  # same init as nn.Linear

    @classmethod
    def from_linear(cls, linear: nn.Linear, approximate: str = "none",
                    impl: str = "auto") -> LinearBiasGELU:
        """Linear followed by GELU(approximate) as one module, sharing `linear`'s parameters."""
        if linear.bias is None:
            raise ValueError("LinearBiasGELU.from_linear: the linear layer has no bias to fuse")
        new = cls(linear.in_features, linear.out_features, approximate, device="meta", impl=impl)
        new.weight, new.bias = linear.weight, linear.bias
        return new.train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu(F.linear(x, self.weight), self.bias, self.approximate, self.impl)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"approximate={self.approximate!r}, impl={self.impl!r}")
