"""LAMB: the optimizer against a float64 hand reference, its two paths, the strategy."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from training_harness.core.errors import HarnessError
from training_harness.core.plan import OptimizerSettings
from training_harness.strategies.base import Choice, Phase
from training_harness.strategies.lamb import Lamb, LambStrategy
from training_harness.strategies.registry import get
from training_harness.strategies.setup import Setup

F64 = torch.float64


def reference(weights, grads_per_step, lr, betas, eps, weight_decay, max_grad_norm=None):
    """LAMB written out with plain float64 math, one tensor at a time.

    `grads_per_step[s][i]` is tensor i's gradient at step s, or None (no update,
    its step count does not advance).
    """
    b1, b2 = betas
    w = [x.detach().to(F64).clone() for x in weights]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    t = [0] * len(w)
    for grads in grads_per_step:
        grads = [None if g is None else g.to(F64) for g in grads]
        if max_grad_norm:
            total = math.sqrt(sum(float((g * g).sum()) for g in grads if g is not None))
            c = min(1.0, max_grad_norm / total)
            grads = [None if g is None else g * c for g in grads]
        for i, g in enumerate(grads):
            if g is None:
                continue
            t[i] += 1
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** t[i])
            v_hat = v[i] / (1 - b2 ** t[i])
            u = m_hat / (torch.sqrt(v_hat) + eps) + weight_decay * w[i]
            w_norm, u_norm = float(w[i].norm()), float(u.norm())
            r = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            w[i] = w[i] - lr * r * u
    return w


def make_params(dtype=F64):
    g = torch.Generator().manual_seed(0)
    return [
        nn.Parameter(5 * torch.randn(4, 3, generator=g, dtype=dtype)),  # a weight, r > 1
        nn.Parameter(0.1 * torch.randn(3, generator=g, dtype=dtype)),  # a bias, r < 1
        nn.Parameter(torch.zeros(5, dtype=dtype)),  # norm 0: trust ratio 1 at first
        nn.Parameter(torch.randn(2, 2, generator=g, dtype=dtype)),  # grad always None
        nn.Parameter(torch.randn(6, generator=g, dtype=dtype)),  # grad None at step 2
    ]


def make_grads(params, steps, seed=1, scales=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        scale = 1.0 if scales is None else scales[s]
        grads = [scale * torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
        grads[3] = None
        if s == 1:
            grads[4] = None
        out.append(grads)
    return out


def run(opt, params, grads_per_step):
    for grads in grads_per_step:
        for p, gr in zip(params, grads, strict=True):
            p.grad = None if gr is None else gr.clone()
        opt.step()


HP = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("steps", [1, 3])
def test_matches_hand_reference(steps, foreach):
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, steps)
    run(Lamb(params, foreach=foreach, **HP), params, grads)
    expected = reference(start, grads, **HP)
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)
    # The no-grad tensor is untouched; the zero tensor moved by lr x u at step 1.
    assert torch.equal(params[3].detach(), start[3])
    assert params[2].detach().abs().min() > 0


def test_trust_ratio_is_applied():
    """Guards the reference test: with r = 1 the weight and bias would move differently."""
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, 1)
    run(Lamb(params, **HP), params, grads)
    for i in (0, 1):
        g, w = grads[0][i], start[i]
        u = g / (g.abs() + HP["eps"]) + HP["weight_decay"] * w  # step 1: m^ = g, v^ = g^2
        step = start[i] - params[i].detach()
        r = float(step.norm() / (HP["lr"] * u.norm()))
        assert r == pytest.approx(float(w.norm() / u.norm()), rel=1e-9)
        assert abs(r - 1) > 0.5


def test_state_and_skipped_params():
    params = make_params()
    opt = Lamb(params, **HP)
    run(opt, params, make_grads(params, 3))
    assert params[3] not in opt.state
    assert set(opt.state[params[0]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert opt.state[params[0]]["step"] == 3
    assert opt.state[params[4]]["step"] == 2
    assert opt.state[params[0]]["exp_avg"].dtype == F64


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_foreach_equals_loop(max_grad_norm):
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    a[2].weight.data = a[2].weight.data.double()  # a second dtype bucket
    b = copy.deepcopy(a)

    def groups(model):
        return [
            {"params": list(model[0].parameters()) + [model[2].weight]},
            {"params": list(model[1].parameters()) + [model[2].bias], "lr": 0.01,
             "weight_decay": 0.0},
        ]

    opts = [
        Lamb(groups(m), lr=0.03, weight_decay=0.05, max_grad_norm=max_grad_norm, foreach=f)
        for m, f in ((a, False), (b, True))
    ]
    gen = torch.Generator().manual_seed(2)
    for step in range(5):
        grads = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in a.parameters()]
        for model in (a, b):
            for i, (p, g) in enumerate(zip(model.parameters(), grads, strict=True)):
                p.grad = None if (step == 2 and i == 1) else g.clone()
        for opt in opts:
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
        sa, sb = opts[0].state[pa], opts[1].state[pb]
        assert sa["step"] == sb["step"]
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("foreach", [False, True])
def test_max_grad_norm_clips_globally(foreach):
    hp = dict(HP, eps=1e-2)  # a large eps so the update depends on the gradient scale
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, 3, scales=[3.0, 0.2, 1.0])
    total = math.sqrt(sum(float((g * g).sum()) for g in grads[0] if g is not None))
    assert total > 1.0  # clipping is active at step 1
    run(Lamb(params, max_grad_norm=1.0, foreach=foreach, **hp), params, grads)
    clipped = reference(start, grads, max_grad_norm=1.0, **hp)
    unclipped = reference(start, grads, **hp)
    for got, want in zip(params, clipped, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)
    assert max(float((c - u).abs().max()) for c, u in zip(clipped, unclipped, strict=True)) > 1e-4
    # The .grad tensors are left as they were.
    assert torch.equal(params[0].grad, grads[2][0])


@pytest.mark.parametrize("off", [None, 0.0, 1e9])
def test_max_grad_norm_off_or_inactive(off):
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, 2)
    run(Lamb(params, max_grad_norm=off, **HP), params, grads)
    for got, want in zip(params, reference(start, grads, **HP), strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("foreach", [False, True])
def test_state_dict_round_trip(foreach):
    params = make_params()
    opt = Lamb(params, max_grad_norm=1.0, foreach=foreach, **HP)
    grads = make_grads(params, 5)
    run(opt, params, grads[:2])

    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    params2 = [nn.Parameter(p.detach().clone()) for p in params]
    opt2 = Lamb(params2, lr=1.0, max_grad_norm=1.0, foreach=foreach)  # groups come from the dict
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf))
    assert opt2.param_groups[0]["lr"] == HP["lr"]

    run(opt, params, grads[2:])
    run(opt2, params2, grads[2:])
    for p, q in zip(params, params2, strict=True):
        assert torch.equal(p, q)
        if p in opt.state:
            assert opt.state[p]["step"] == opt2.state[q]["step"]
            assert torch.equal(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])
            assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"lr": -1e-3}, "lr"),
        ({"betas": (1.0, 0.999)}, "betas"),
        ({"betas": (0.9, -0.1)}, "betas"),
        ({"eps": 0.0}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ],
)
def test_bad_hyper_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Lamb([nn.Parameter(torch.zeros(2))], **kwargs)


def test_sparse_gradients_refused():
    p = nn.Parameter(torch.zeros(4))
    p.grad = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        Lamb([p]).step()


@pytest.mark.parametrize("impl, foreach", [("default", False), ("foreach", True), ("fused", True)])
def test_strategy_factory_uses_plan_hyper_parameters(impl, foreach):
    hp = OptimizerSettings(lr=0.02, weight_decay=0.1, betas=(0.8, 0.9), eps=1e-7)
    setup = Setup(model=nn.Linear(4, 3), device=torch.device("cpu"), hyper=hp)
    setup.optimizer_impl = impl
    strategy = LambStrategy()
    strategy.apply(Phase.OPTIMIZER, setup, strategy.Settings(max_grad_norm=1.0))
    opt = setup.build_optimizer()
    assert isinstance(opt, Lamb)
    group = opt.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["eps"]) == (0.02, 0.1, 1e-7)
    assert tuple(group["betas"]) == (0.8, 0.9)
    assert group["foreach"] is foreach
    assert opt.max_grad_norm == 1.0
    assert len(group["params"]) == 2

    strategy.apply(Phase.OPTIMIZER, setup, strategy.Settings())  # 0 = off
    assert setup.build_optimizer().max_grad_norm is None


def test_strategy_registered_with_its_space():
    strategy = get("lamb")
    assert isinstance(strategy, LambStrategy)
    assert strategy.phases == (Phase.OPTIMIZER,)
    assert strategy.requires == "nothing"
    assert strategy.space() == {"max_grad_norm": Choice((0.0, 1.0))}
    assert strategy.parse({}).max_grad_norm == 0.0
    assert strategy.parse({"max_grad_norm": 1.0}).max_grad_norm == 1.0
    with pytest.raises(HarnessError, match="max_grad_norm"):
        strategy.parse({"max_grad_norm": -1.0})
