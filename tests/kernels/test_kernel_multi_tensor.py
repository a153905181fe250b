"""Multi-tensor AdamW and LAMB steps against torch.optim.AdamW and strategies.lamb.Lamb.

fp32, several steps: parameters and moments within rtol 1e-5, atol 1e-6 (the
kernels fuse each update in fp32 registers; torch rounds after every op, and the
norms are summed in another order). bf16 parameters, one step: against the same
update done in float64 from the same bf16 values, rtol 1e-2 (one bf16 rounding).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")

from training_harness.kernels.multi_tensor import (  # noqa: E402
    BLOCK,
    MultiTensorAdamW,
    adamw_step,
    adamw_step_reference,
    lamb_step,
)
from training_harness.strategies import lamb  # noqa: E402

# odd sizes, one element, exactly one block, one element past it, a 2-D tensor, and
# an empty one
SHAPES = [(3,), (1,), (BLOCK,), (BLOCK + 1,), (7, 13), (0,), (2 * BLOCK + 5,)]
FP32 = dict(rtol=1e-5, atol=1e-6)


def _params(device, dtype=torch.float32, zero_one=False):
    torch.manual_seed(0)
    ps = [torch.randn(s, device=device, dtype=dtype) for s in SHAPES]
    if zero_one:
        ps[4].zero_()  # ||w|| = 0: LAMB's trust ratio is 1
    return ps


def _run_against(optimizer, step_fn, eps, device, steps=5, clip=None, zero_one=False):
    ours = _params(device, zero_one=zero_one)
    theirs = [p.clone().requires_grad_() for p in ours]
    opt = optimizer(theirs)
    ms, vs = [torch.zeros_like(p) for p in ours], [torch.zeros_like(p) for p in ours]
    for step in range(1, steps + 1):
        grads = [torch.randn_like(p) for p in ours]
        for p, g in zip(theirs, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        scale = None
        if clip is not None:  # Lamb's clipping coefficient, computed the same way
            total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            scale = clip / total.clamp(min=clip)
        step_fn(ours, grads, ms, vs, step, 1e-2, 0.9, 0.99, eps, 0.1, grad_scale=scale,
                impl="triton")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(a, b.detach(), **FP32, msg=lambda m, i=i: f"param {i}: {m}")
        state = opt.state[b]
        torch.testing.assert_close(ms[i], state["exp_avg"], **FP32)
        torch.testing.assert_close(vs[i], state["exp_avg_sq"], **FP32)
    return ours


def test_adamw_matches_torch(device):
    def adamw(ps):
        return torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
                                 foreach=False)
    start = _params(device)
    end = _run_against(adamw, adamw_step, 1e-8, device)
    assert not torch.equal(start[0], end[0])  # it moved


@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
def test_lamb_matches_strategies_lamb(foreach, clip, device):
    def make(ps):
        return lamb.Lamb(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1,
                         max_grad_norm=clip, foreach=foreach)
    _run_against(make, lamb_step, 1e-6, device, clip=clip, zero_one=True)


def test_bf16_params_one_step(device):
    ours = _params(device, torch.bfloat16)
    grads = [torch.randn_like(p) for p in ours]
    ms = [torch.randn_like(p).abs() for p in ours]
    vs = [m.square() for m in ms]
    ref = [[t.double() for t in lst] for lst in (ours, grads, ms, vs)]
    adamw_step(ours, grads, ms, vs, 3, 1e-2, 0.9, 0.99, 1e-8, 0.1, impl="triton")
    adamw_step_reference(*ref, 3, 1e-2, 0.9, 0.99, 1e-8, 0.1)
    for a, b in zip(ours + ms + vs, ref[0] + ref[2] + ref[3], strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-2, atol=1e-3)


def test_optimizer_and_state_dict_interchange(device):
    torch.manual_seed(1)
    a = [torch.randn(s, device=device, requires_grad=True) for s in SHAPES]
    b = [p.detach().clone().requires_grad_() for p in a]
    ref = torch.optim.AdamW(b, lr=1e-2, foreach=False)
    for _ in range(2):
        for p in b:
            p.grad = torch.randn_like(p)
        ref.step()
    ours = MultiTensorAdamW(a, lr=1e-2)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))  # else they share the moments
    with torch.no_grad():
        for p, q in zip(a, b, strict=True):
            p.copy_(q)
    for _ in range(2):
        for p, q in zip(a, b, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, **FP32)
    assert ours.state[a[0]]["step"].item() == 4


def test_checks(device):
    p = torch.randn(4, device=device)
    with pytest.raises(ValueError, match="same length"):
        adamw_step([p], [], [], [], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, impl="triton")
    with pytest.raises(ValueError, match="sizes differ"):
        lamb_step([p], [p[:2]], [p], [p], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, impl="triton")
    adamw_step([], [], [], [], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0)  # nothing to do
