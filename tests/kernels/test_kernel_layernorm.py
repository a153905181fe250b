"""Fused LayerNorm against F.layer_norm in float64: output, dx, dweight, dbias.

Tolerances: conftest.TOLERANCES (fp32 rtol 1e-5; bf16 rtol 1e-2, atol 1e-3 of the max).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from training_harness.kernels.layernorm import FusedLayerNorm, layer_norm, layer_norm_reference  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
# rows x width: width not a power of 2 (masked lanes), a single row, a 3-D input,
# a width just under a power of two and a width of 1
SHAPES = [(37, 129), (1, 64), (2, 3, 100), (5, 1000), (4, 1)]


def _run(shape, dtype, device, affine=(True, True), eps=1e-5):
    n = shape[-1]
    x = torch.randn(shape, dtype=torch.float64) * 3 + 0.5
    w = torch.randn(n, dtype=torch.float64) if affine[0] else None
    b = torch.randn(n, dtype=torch.float64) if affine[1] else None
    inputs = [t.to(device, dtype).requires_grad_() if t is not None else None for t in (x, w, b)]
    y = layer_norm(*inputs, eps=eps, impl="triton")
    dy = torch.randn_like(y)
    y.backward(dy)
    ref_in = [t.detach().double().cpu().requires_grad_() if t is not None else None
              for t in inputs]
    y_ref = layer_norm_reference(*ref_in, eps=eps)
    y_ref.backward(dy.double().cpu())
    return inputs, y, ref_in, y_ref, dy.double().cpu()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_gradients_match_float64(shape, dtype, device, assert_matches):
    torch.manual_seed(0)
    inputs, y, ref_in, y_ref, dy = _run(shape, dtype, device)
    assert y.dtype == dtype and y.shape == torch.Size(shape)
    assert_matches(y, y_ref, dtype, "y")
    # dx = rstd·(w·dy - mean(w·dy) - xhat·mean(xhat·w·dy)) cancels to 0 at width 1: its
    # error is a rounding of the terms, of size |w·dy|·rstd (rstd = 1/sqrt(eps) there;
    # an FMA on CUDA leaves ~3e-5 of 316).
    x, w = (r.detach() for r in ref_in[:2])
    rstd = (x.var(-1, unbiased=False) + 1e-5).rsqrt().max().item()
    terms = (dy * w).abs().max().item() * rstd
    for name, t, r in zip(("dx", "dweight", "dbias"), inputs, ref_in, strict=True):
        assert t.grad.dtype == dtype
        assert_matches(t.grad, r.grad, dtype, name, scale=terms if name == "dx" else None)


@pytest.mark.parametrize("affine", [(True, False), (False, False)], ids=["no-bias", "no-affine"])
def test_without_weight_or_bias(affine, device, assert_matches):
    torch.manual_seed(1)
    inputs, y, ref_in, y_ref, _ = _run((9, 33), torch.float32, device, affine)
    assert_matches(y, y_ref, torch.float32, "y")
    assert_matches(inputs[0].grad, ref_in[0].grad, torch.float32, "dx")
    if affine[0]:
        assert_matches(inputs[1].grad, ref_in[1].grad, torch.float32, "dweight")


def test_tolerance_discriminates(device, assert_matches):
    """The checks can fail: a bf16 result does not pass the fp32 tolerance, nor a wrong eps."""
    torch.manual_seed(2)
    _, y, _, y_ref, _ = _run((8, 64), torch.bfloat16, device)
    with pytest.raises(AssertionError):
        assert_matches(y, y_ref, torch.float32, "bf16 at fp32 tolerance")
    x = torch.randn(8, 64, dtype=torch.float64) * 0.05
    wrong = layer_norm(x.float().to(device), eps=1e-3, impl="triton")
    with pytest.raises(AssertionError):
        assert_matches(wrong, layer_norm_reference(x, eps=1e-5), torch.float32, "eps")


def test_module_is_a_drop_in(device, assert_matches):
    torch.manual_seed(3)
    ln = nn.LayerNorm((4, 10), device=device)
    nn.init.normal_(ln.weight)
    nn.init.normal_(ln.bias)
    fused = FusedLayerNorm.from_layernorm(ln)
    assert fused.weight is ln.weight and fused.bias is ln.bias
    assert list(fused.state_dict()) == list(ln.state_dict())
    assert isinstance(fused, nn.LayerNorm)
    x = torch.randn(3, 4, 10, device=device, dtype=torch.float64)
    expected = nn.functional.layer_norm(x, (4, 10), ln.weight.double(), ln.bias.double())
    assert_matches(fused(x.float()), expected, torch.float32, "module output")
    with pytest.raises(RuntimeError):
        fused(torch.randn(3, 10, 4, device=device))  # wrong trailing shape: torch's error


def test_dispatch(monkeypatch):
    x = torch.randn(4, 8)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not x.is_cuda:
        with pytest.raises(RuntimeError, match="cannot run here"):
            layer_norm(x, impl="triton")
        torch.testing.assert_close(layer_norm(x), layer_norm_reference(x))  # auto: reference
    with pytest.raises(ValueError, match="impl"):
        layer_norm(x, impl="fast")
