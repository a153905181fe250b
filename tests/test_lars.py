"""LARS: the optimizer against a float64 hand reference, its two paths, the strategy's
grouping (biases and gains out of the trust ratio and weight decay) and refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.estimator.models import CPU
from training_harness.core.errors import HarnessError
from training_harness.core.plan import OptimizerSettings, Plan
from training_harness.strategies.base import Choice, Phase
from training_harness.strategies.lars import Lars, LarsStrategy
from training_harness.strategies.registry import get
from training_harness.strategies.setup import Setup

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference(weights, grads_per_step, lr, momentum, weight_decay, eta, eps):
    """LARS written out with plain float64 math, one tensor at a time: tensors of one
    dimension (biases, gains) take plain momentum SGD, no trust ratio, no weight decay.
    `grads_per_step[s][i]` is None where tensor i has no gradient at step s."""
    w = [x.detach().to(F64).clone() for x in weights]
    buf: list[torch.Tensor | None] = [None] * len(w)
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            if g is None:
                continue
            g = g.to(F64)
            if w[i].dim() >= 2:
                w_norm, g_norm = float(w[i].norm()), float(g.norm())
                r = (eta * w_norm / (g_norm + weight_decay * w_norm + eps)
                     if w_norm > 0 and g_norm > 0 else 1.0)
                d = r * (g + weight_decay * w[i])
            else:
                d = g
            buf[i] = d if buf[i] is None else momentum * buf[i] + d
            w[i] = w[i] - lr * buf[i]
    return w


def make_params():
    g = torch.Generator().manual_seed(0)
    return [
        nn.Parameter(5 * torch.randn(4, 3, generator=g, dtype=F64)),  # a weight
        nn.Parameter(0.1 * torch.randn(3, generator=g, dtype=F64)),  # a bias: no ratio
        nn.Parameter(torch.zeros(5, 2, dtype=F64)),  # norm 0: trust ratio 1 at first
        nn.Parameter(torch.randn(2, 2, generator=g, dtype=F64)),  # grad always None
        nn.Parameter(torch.randn(6, 2, generator=g, dtype=F64)),  # grad None at step 2
    ]


def make_grads(params, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
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


HP = OptimizerSettings(lr=0.5, weight_decay=0.1)
SETTINGS = dict(momentum=0.9, trust_coefficient=0.02, eps=1e-8)


def strategy_optimizer(params, impl="default", **settings):
    setup = Setup(model=nn.Linear(1, 1), device=torch.device("cpu"), hyper=HP)
    strategy = LarsStrategy()
    strategy.apply(Phase.OPTIMIZER, setup, strategy.Settings(**{**SETTINGS, **settings}))
    return setup.optimizer_factory(params, HP, impl)


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
@pytest.mark.parametrize("steps", [1, 3])
def test_matches_float64_reference(steps, impl):
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, steps)
    run(strategy_optimizer(params, impl), params, grads)
    expected = reference(start, grads, HP.lr, SETTINGS["momentum"], HP.weight_decay,
                         SETTINGS["trust_coefficient"], SETTINGS["eps"])
    for got, want in zip(params, expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-12, atol=1e-14)
    assert torch.equal(params[3].detach(), start[3])  # no gradient: untouched


def test_trust_ratio_and_the_excluded_bias():
    """Guards the reference: at step 1 the weight moves by lr x r x (g + wd w), r far from
    1, and the bias by exactly lr x g."""
    params = make_params()
    start = [p.detach().clone() for p in params]
    grads = make_grads(params, 1)
    run(strategy_optimizer(params), params, grads)
    g, w = grads[0][0], start[0]
    u = g + HP.weight_decay * w
    r = float((start[0] - params[0].detach()).norm() / (HP.lr * u.norm()))
    eta = SETTINGS["trust_coefficient"]
    want = eta * float(w.norm()) / (float(g.norm()) + 0.1 * float(w.norm()) + SETTINGS["eps"])
    assert r == pytest.approx(want, rel=1e-9)
    assert r < 0.1
    torch.testing.assert_close(start[1] - params[1].detach(), HP.lr * grads[0][1],
                               rtol=1e-12, atol=0)


def test_one_group_as_given_state_and_momentum_zero():
    params = make_params()
    opt = strategy_optimizer(params)
    # biases and gains are left out per tensor: the groups stay the ones given (ZeRO-1)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["exclude_vectors"]
    run(opt, params, make_grads(params, 2))
    assert set(opt.state[params[0]]) == {"momentum_buffer"}  # one buffer: the estimator's
    assert params[3] not in opt.state
    plain = make_params()
    opt0 = strategy_optimizer(plain, momentum=0.0)
    run(opt0, plain, make_grads(plain, 2))
    assert not opt0.state  # no momentum: no state


def test_zero1_steps_lars_as_one_process_does(tmp_path):
    """ZeroRedundancyOptimizer (one gloo rank) around the strategy's factory, as zero
    stage 1 builds it: the same weights as LARS alone."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        a = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4)).double()
        b = copy.deepcopy(a)
        alone = strategy_optimizer(list(a.parameters()))
        zero = ZeroRedundancyOptimizer(
            list(b.parameters()),
            optimizer_class=lambda p, **_: strategy_optimizer(p))
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            grads = [torch.randn(p.shape, generator=gen, dtype=F64) for p in a.parameters()]
            for model in (a, b):
                for p, g in zip(model.parameters(), grads, strict=True):
                    p.grad = g.clone()
            alone.step()
            zero.step()
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-14)
    finally:
        dist.destroy_process_group()


def test_foreach_equals_loop_on_a_model():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    b = copy.deepcopy(a)
    opts = [strategy_optimizer(list(m.parameters()), impl)
            for m, impl in ((a, "default"), (b, "foreach"))]
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        grads = [torch.randn(p.shape, generator=gen) for p in a.parameters()]
        for model in (a, b):
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g.clone()
        for opt in opts:
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs, name", [
    ({"lr": -1.0}, "lr"), ({"momentum": 1.0}, "momentum"), ({"weight_decay": -0.1},
    "weight_decay"), ({"trust_coefficient": 0.0}, "trust_coefficient"), ({"eps": -1.0}, "eps"),
])
def test_bad_hyper_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Lars([nn.Parameter(torch.zeros(2))], **kwargs)


def test_strategy_registered_its_space_and_settings():
    strategy = get("lars")
    assert isinstance(strategy, LarsStrategy)
    assert strategy.phases == (Phase.OPTIMIZER,)
    assert strategy.space() == {"momentum": Choice((0.9, 0.95))}
    assert strategy.parse({}).trust_coefficient == 1e-3
    with pytest.raises(HarnessError, match="momentum"):
        strategy.parse({"momentum": 1.5})
    with pytest.raises(HarnessError, match="trust_coefficient"):
        strategy.parse({"trust_coefficient": 0.0})


@pytest.mark.parametrize("strategies, words", [
    ({"lamb": {}}, "a plan has one optimizer"),
    ({"muon": {}}, "a plan has one optimizer"),
    ({"fused": {"optimizer": "triton"}}, "no LARS kernel"),
])
def test_refusals_say_why(strategies, words):
    strategy = get("lars")
    plan = Plan(strategies={"lars": {}, **strategies})
    reasons = strategy.check(strategy.parse({}), plan, CPU)
    assert len(reasons) == 1 and words in reasons[0]
    assert strategy.check(strategy.parse({}), Plan(strategies={"lars": {}, "fused": {}}),
                          CPU) == []
