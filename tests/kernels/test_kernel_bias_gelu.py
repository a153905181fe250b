"""Fused bias + GELU (erf and tanh) against F.gelu(x + b) in float64: y, dx, dbias.

Tolerances: conftest.TOLERANCES (fp32 rtol 1e-5; bf16 rtol 1e-2, atol 1e-3 of the max).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("triton")

from training_harness.kernels.bias_gelu import LinearBiasGELU, bias_gelu, bias_gelu_reference  # noqa: E402

# numpy warns when the sigmoid's exp overflows to inf for very negative inputs (the
# result, 0, is right)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DTYPES = [torch.float32, torch.bfloat16]
# (rows, width) with the tile 64 x 64: odd width, a single row, 3-D input, several
# tiles across the width, several tiles down the rows with a partial last one
SHAPES = [(37, 129), (1, 64), (2, 5, 200), (130, 3)]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_gradients_match_float64(shape, dtype, approximate, device, assert_matches):
    torch.manual_seed(0)
    x = (torch.randn(shape, dtype=torch.float64) * 3).to(device, dtype).requires_grad_()
    b = torch.randn(shape[-1], dtype=torch.float64).to(device, dtype).requires_grad_()
    y = bias_gelu(x, b, approximate, impl="triton")
    dy = torch.randn_like(y)
    y.backward(dy)
    xr, br = (t.detach().double().cpu().requires_grad_() for t in (x, b))
    y_ref = bias_gelu_reference(xr, br, approximate)
    y_ref.backward(dy.double().cpu())
    assert y.dtype == x.grad.dtype == b.grad.dtype == dtype
    assert_matches(y, y_ref, dtype, "y")
    assert_matches(x.grad, xr.grad, dtype, "dx")
    assert_matches(b.grad, br.grad, dtype, "dbias")


def test_tanh_and_erf_differ(device):
    """The two GELUs differ by up to ~5e-4 near |z| ~ 2: the kernel honours `approximate`."""
    z = torch.linspace(-4, 4, 101, device=device)
    zero = torch.zeros(101, device=device)
    gap = (bias_gelu(z[None], zero, "tanh", impl="triton")
           - bias_gelu(z[None], zero, "none", impl="triton")).abs().max()
    assert gap > 1e-4


def test_extreme_inputs_are_finite(device):
    x = torch.tensor([[-1e4, -100.0, 0.0, 100.0, 1e4]], device=device, requires_grad=True)
    for approximate in ("none", "tanh"):
        y = bias_gelu(x, torch.zeros(5, device=device), approximate, impl="triton")
        y.sum().backward()
        torch.testing.assert_close(y.detach().cpu(), torch.tensor([[0.0, 0.0, 0.0, 100.0, 1e4]]))
        torch.testing.assert_close(x.grad.cpu(), torch.tensor([[0.0, 0.0, 0.5, 1.0, 1.0]]))
        x.grad = None


def test_linear_bias_gelu_module(device, assert_matches):
    torch.manual_seed(1)
    linear = nn.Linear(24, 40, device=device)
    fused = LinearBiasGELU.from_linear(linear, approximate="tanh")
    assert fused.weight is linear.weight and fused.bias is linear.bias
    assert list(fused.state_dict()) == list(linear.state_dict())
    x = torch.randn(3, 7, 24, device=device)
    y = fused(x)
    y.square().sum().backward()
    grads = [p.grad.clone() for p in (linear.weight, linear.bias)]
    linear.zero_grad()
    wr, br, xr = (t.detach().double().cpu().requires_grad_() for t in (linear.weight,
                                                                       linear.bias, x))
    y_ref = F.gelu(F.linear(xr, wr, br), approximate="tanh")
    y_ref.square().sum().backward()
    assert_matches(y, y_ref, torch.float32, "y")
    assert_matches(grads[0], wr.grad, torch.float32, "dweight")
    assert_matches(grads[1], br.grad, torch.float32, "dbias")
    fresh = LinearBiasGELU(24, 40)
    assert [p.shape for p in fresh.parameters()] == [p.shape for p in linear.parameters()]
    with pytest.raises(ValueError, match="no bias"):
        LinearBiasGELU.from_linear(nn.Linear(4, 4, bias=False))
    with pytest.raises(ValueError, match="approximate"):
        bias_gelu(x, linear.bias, "fast")
