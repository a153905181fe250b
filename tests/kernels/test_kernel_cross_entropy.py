"""Chunked cross-entropy against F.cross_entropy in float64: loss and dlogits.

Tolerances: the loss is fp32 whatever the logits' dtype, so it is held to the fp32
tolerance (rtol 1e-5) for bf16 logits too; the gradient has the logits' dtype and
conftest.TOLERANCES for it (bf16: rtol 1e-2, atol 1e-3 of the max).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("triton")

import training_harness.kernels.cross_entropy as ce  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=[1024, ce.MAX_BLOCK_V], ids=["chunk1024", "chunk-default"])
def block_v(request, monkeypatch):
    """V = 5003 is 5 chunks of 1024, the last one partial, or a single default chunk."""
    monkeypatch.setattr(ce, "MAX_BLOCK_V", request.param)
    return request.param


def _logits_targets(n, v, dtype, device, scale=4.0, ignored=()):
    logits = (torch.randn(n, v, dtype=torch.float64) * scale).to(device, dtype)
    targets = torch.randint(0, v, (n,), device=device)
    for i in ignored:
        targets[i] = -100
    return logits, targets


def _check(logits, targets, reduction, dtype, assert_matches, inplace=True):
    leaf = logits.detach().clone().requires_grad_()
    loss = ce.cross_entropy(leaf.clone(), targets, reduction=reduction, inplace=inplace,
                            impl="triton")
    dloss = torch.rand_like(loss) + 0.5
    loss.backward(dloss)
    ref_leaf = logits.detach().double().cpu().requires_grad_()
    ref = ce.cross_entropy_reference(ref_leaf, targets.cpu(), reduction=reduction)
    ref.backward(dloss.double().cpu())
    assert loss.dtype == torch.float32 and leaf.grad.dtype == dtype
    assert_matches(loss, ref, torch.float32, f"loss ({reduction})")
    assert_matches(leaf.grad, ref_leaf.grad, dtype, f"dlogits ({reduction})")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_vocabulary_matches_float64(dtype, reduction, block_v, device, assert_matches):
    torch.manual_seed(0)
    logits, targets = _logits_targets(9, 5003, dtype, device, ignored=(3,))
    _check(logits, targets, reduction, dtype, assert_matches)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, v", [(1, 5003), (6, 7), (4, 1)], ids=["one-row", "tiny-v", "v=1"])
def test_odd_shapes(n, v, dtype, device, assert_matches):
    torch.manual_seed(1)
    logits, targets = _logits_targets(n, v, dtype, device)
    _check(logits, targets, "mean", dtype, assert_matches)


def test_large_logits_are_stable(device, assert_matches):
    """Logits of +-1e4: a naive exp overflows; the online log-sum-exp does not."""
    torch.manual_seed(2)
    logits, targets = _logits_targets(5, 300, torch.float32, device, scale=1e4)
    _check(logits, targets, "mean", torch.float32, assert_matches)


def test_inplace_overwrites_the_logits_and_out_of_place_does_not(device, assert_matches):
    torch.manual_seed(3)
    base = (torch.randn(4, 50, device=device)).requires_grad_()
    targets = torch.randint(0, 50, (4,), device=device)
    for inplace in (True, False):
        logits = base * 1.0  # a non-leaf, like an lm_head output
        kept = logits.detach().clone()
        ce.cross_entropy(logits, targets, inplace=inplace, impl="triton").backward()
        expected = torch.softmax(kept.double(), 1) - nn.functional.one_hot(targets, 50)
        if inplace:  # the logits now hold the gradient, which autograd passed on to base
            assert_matches(logits, expected / 4, torch.float32, "gradient in the logits")
        else:
            assert torch.equal(logits.detach(), kept)
        assert_matches(base.grad, expected / 4, torch.float32, "base.grad")
        base.grad = None


def test_no_write_without_gradient(device):
    logits = torch.randn(3, 20, device=device)
    kept = logits.clone()
    targets = torch.randint(0, 20, (3,), device=device)
    leaf = logits.clone().requires_grad_()
    with torch.no_grad():
        ce.cross_entropy(logits, targets, impl="triton")
        ce.cross_entropy(leaf, targets, impl="triton")
    ce.cross_entropy(logits, targets, impl="triton")  # no requires_grad
    assert torch.equal(logits, kept) and torch.equal(leaf.detach(), kept)
    loss = ce.cross_entropy(leaf, targets, impl="triton")  # a leaf is never overwritten
    loss.backward()
    assert torch.equal(leaf.detach(), kept)


def test_backward_twice_is_refused(device):
    logits = torch.randn(3, 20, device=device, requires_grad=True)
    loss = ce.cross_entropy(logits * 1.0, torch.randint(0, 20, (3,), device=device),
                            impl="triton")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # 1 / n_valid, n_valid = 0
def test_all_ignored_gives_nan_like_torch(device):
    logits = torch.randn(3, 20, device=device, requires_grad=True)
    targets = torch.full((3,), -100, device=device)
    loss = ce.cross_entropy(logits * 1.0, targets, impl="triton")
    assert torch.isnan(loss) and torch.isnan(nn.functional.cross_entropy(logits, targets))
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_module(device):
    criterion = ce.ChunkedCrossEntropy.from_loss(nn.CrossEntropyLoss(ignore_index=0))
    assert criterion.ignore_index == 0 and criterion.reduction == "mean"
    logits = torch.randn(6, 11, device=device)
    targets = torch.randint(0, 11, (6,), device=device)
    torch.testing.assert_close(criterion(logits, targets),
                               nn.functional.cross_entropy(logits, targets, ignore_index=0))
    with pytest.raises(ValueError, match="label smoothing"):
        ce.ChunkedCrossEntropy.from_loss(nn.CrossEntropyLoss(label_smoothing=0.1))
    with pytest.raises(ValueError, match="reduction"):
        ce.ChunkedCrossEntropy(reduction="max")
