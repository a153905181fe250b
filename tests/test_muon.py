"""Muon: the blocks' 2-D weights get torch.optim.Muon's orthogonalised update, the other
parameters AdamW's; one optimizer to the step and the lr schedule; the refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from tests.estimator.models import CPU
from tests.tiny import tiny_gpt
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.strategies.base import Choice, Phase
from training_harness.strategies.compose import compose
from training_harness.strategies.muon import MuonStrategy, MuonWithAdamW
from training_harness.strategies.registry import get

HIDDEN = {f"blocks.{i}.{m}.weight" for i in (0, 1) for m in ("qkv", "proj", "mlp.up",
                                                               "mlp.down")}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def composed(settings=None, lr=1e-2, weight_decay=0.0):
    torch.manual_seed(0)
    model = tiny_gpt().build_model()
    plan = Plan(micro_batch_size=8, global_batch_size=8, strategies={"muon": settings or {}})
    plan.optimizer.lr, plan.optimizer.weight_decay = lr, weight_decay
    return compose(model, plan, "cpu")


def conditioned(shape, cond, gen):
    """A gradient with singular values spread log-evenly over a factor `cond`."""
    k = min(shape)
    u, _ = torch.linalg.qr(torch.randn(shape[0], k, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(shape[1], k, generator=gen))
    return 1e-3 * u @ torch.diag(torch.logspace(0, math.log10(cond), k)) @ v.T


def test_the_split_hidden_matrices_to_muon_the_rest_to_adamw():
    setup = composed()
    opt = setup.optimizer
    assert isinstance(opt, MuonWithAdamW)
    names = {id(p): n for n, p in setup.model.named_parameters()}
    muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert muon == HIDDEN
    assert isinstance(opt.adamw, torch.optim.AdamW)
    # embeddings (wte is also the tied head), positions, gains and biases
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "blocks.0.qkv.bias"} <= adamw
    assert muon | adamw == set(names.values()) and not muon & adamw


def test_the_split_sees_through_ddp_and_checkpointing(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training_harness.strategies.muon import hidden_matrices

    setup = composed()
    want = {id(p) for n, p in setup.model.named_parameters() if n in HIDDEN}
    assert hidden_matrices(setup.model) == want
    checkpointed = compose(tiny_gpt().build_model(), {"checkpoint": {}}, "cpu").model
    names = {id(p): n for n, p in checkpointed.named_parameters()}
    assert {names[i].replace("_checkpoint_wrapped_module.", "")
            for i in hidden_matrices(checkpointed)} == HIDDEN
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0,
                            world_size=1)
    try:
        wrapped = DistributedDataParallel(setup.model)
        assert hidden_matrices(wrapped) == want
    finally:
        dist.destroy_process_group()


def test_muon_update_is_orthogonalised_and_the_rest_is_adamw():
    lr = 1e-2
    setup = composed({"momentum": 0.0}, lr=lr)  # momentum 0: the update is of g itself
    model, opt = setup.model, setup.optimizer
    reference = copy.deepcopy(model)
    rest = [p for n, p in reference.named_parameters() if n not in HIDDEN]
    adamw = torch.optim.AdamW(rest, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            g = (conditioned(p.shape, 100.0, gen) if name in HIDDEN
                 else torch.randn(p.shape, generator=gen))
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        adamw.step()
        for name, p in model.named_parameters():
            if name not in HIDDEN:
                continue
            rows, cols = p.shape
            # torch.optim.Muon's "match_rms_adamw" lr: 0.2 sqrt(max(rows, cols)) x lr
            update = (start[name] - p.detach()) / (lr * 0.2 * math.sqrt(max(rows, cols)))
            sv = torch.linalg.svdvals(update)
            grad_sv = torch.linalg.svdvals(p.grad)
            assert grad_sv.max() / grad_sv.min() > 50  # the gradient's spread
            # Five quintic Newton-Schulz steps (bf16) put them in about [0.68, 1.16] for a
            # gradient spread over 100 (torch's docstring: "S' ~ Uniform(0.5, 1.5)")
            assert float(sv.min()) > 0.6 and float(sv.max()) < 1.25, (name, sv)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name not in HIDDEN:
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def test_one_optimizer_for_the_schedule_and_the_state():
    setup = composed({"lr_ratio": 20.0, "adjust_lr": "original"})
    opt = setup.optimizer
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.2)
    assert opt.muon.param_groups[0]["adjust_lr_fn"] == "original"
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.1)  # both halves scaled
    assert opt.adamw.param_groups[0]["lr"] == pytest.approx(5e-3)
    w = tiny_gpt()
    setup.step([w.batch(8, 0, "cpu")], w.loss)
    schedule.step()
    state = opt.state_dict()
    assert set(state) == {"muon", "adamw"}
    muon_state = next(iter(state["muon"]["state"].values()))
    assert set(muon_state) == {"momentum_buffer"}  # one buffer: the estimator's count


def test_training_goes_down():
    setup = composed()
    w = tiny_gpt()
    losses = [float(setup.step([w.batch(8, s, "cpu")], w.loss)) for s in range(5)]
    assert losses[-1] < losses[0] - 0.1


def test_a_model_without_hidden_matrices_is_refused_with_the_reason():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(HarnessError, match="no 2-D weights inside repeated blocks"):
        compose(model, {"muon": {}}, "cpu")


@pytest.mark.parametrize("strategies, layout, words", [
    ({"lamb": {}}, Layout(), "a plan has one optimizer"),
    ({"lars": {}}, Layout(), "a plan has one optimizer"),
    ({"zero": {}}, Layout(data=2), "zero stage 2 (FSDP2)"),  # zero's default stage
    ({"zero": {"stage": 3}}, Layout(data=2), "zero stage 3 (FSDP2)"),
    ({"zero": {"stage": 1}}, Layout(data=2), "ZeroRedundancyOptimizer"),
    ({"tensor": {}}, Layout(tensor=2), "tensor parallel"),
])
def test_refusals_say_why(strategies, layout, words):
    strategy = get("muon")
    plan = Plan(layout=layout, strategies={"muon": {}, **strategies})
    reasons = strategy.check(strategy.parse({}), plan, CPU)
    assert len(reasons) == 1 and words in reasons[0], reasons
    ok = Plan(layout=Layout(data=2), strategies={"muon": {}, "ddp": {}})
    assert strategy.check(strategy.parse({}), ok, CPU) == []


def test_strategy_registered_its_space_and_settings():
    strategy = get("muon")
    assert isinstance(strategy, MuonStrategy)
    assert strategy.phases == (Phase.OPTIMIZER,)
    assert strategy.space() == {"momentum": Choice((0.9, 0.95))}
    assert strategy.parse({}).adjust_lr == "match_rms_adamw"
    with pytest.raises(HarnessError, match="lr_ratio"):
        strategy.parse({"lr_ratio": 0.0})
    with pytest.raises(HarnessError, match="adjust_lr"):
        strategy.parse({"adjust_lr": "other"})
