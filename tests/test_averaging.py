"""Weight averaging: EMA and SWA against averages computed by hand, evaluation with the
averages (and the model's own weights back after), its update inside the step, the
convergence run evaluating with it, and the refusals."""

from __future__ import annotations

import pytest
import torch

from tests.estimator.models import CPU
from tests.tiny import tiny_gpt
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import TargetSpec
from training_harness.measure.convergence import maths_plan, train_to_target
from training_harness.strategies.averaging import AveragingStrategy
from training_harness.strategies.base import Choice, Phase
from training_harness.strategies.compose import compose
from training_harness.strategies.registry import get


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(settings, steps):
    """The composed tiny GPT after `steps` steps, and its weights after each step."""
    w = tiny_gpt()
    torch.manual_seed(0)
    model = w.build_model()
    plan = Plan(micro_batch_size=8, global_batch_size=8,
                strategies={"averaging": settings} if settings is not None else {})
    plan.optimizer.lr = 1e-2
    setup = compose(model, plan, "cpu")
    weights, losses = [], []
    for s in range(steps):
        losses.append(float(setup.step([w.batch(8, s, "cpu")], w.loss)))
        weights.append({n: p.detach().clone() for n, p in setup.model.named_parameters()})
    return setup, weights, losses


def averaged(setup):
    with setup.evaluation():
        return {n: p.detach().clone() for n, p in setup.model.named_parameters()}


def test_ema_matches_the_hand_computed_average():
    decay = 0.8
    setup, weights, _ = run({"method": "ema", "decay": decay}, 4)
    by_hand = dict(weights[0])  # the first average is the weights after step 1
    for later in weights[1:]:
        by_hand = {n: decay * by_hand[n] + (1 - decay) * later[n] for n in by_hand}
    got = averaged(setup)
    for name, value in by_hand.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7)
    assert max(float((got[n] - weights[-1][n]).abs().max()) for n in got) > 1e-4
    # the model's own weights are back after evaluating
    for name, p in setup.model.named_parameters():
        assert torch.equal(p.detach(), weights[-1][name])


def test_swa_from_start_every_k_is_the_mean_of_those_steps():
    setup, weights, _ = run({"method": "swa", "start": 1, "every": 2}, 6)
    got = averaged(setup)
    for name in got:  # steps 2, 4 and 6 (indices 1, 3, 5)
        mean = (weights[1][name] + weights[3][name] + weights[5][name]) / 3
        torch.testing.assert_close(got[name], mean, rtol=1e-6, atol=1e-7)
    assert setup.evaluation.__self__.averaged == 3


def test_training_is_unchanged_and_the_update_is_inside_the_step():
    setup, weights, losses = run({"decay": 0.9}, 3)
    _, plain_weights, plain_losses = run(None, 3)
    assert losses == plain_losses
    for name, value in weights[-1].items():
        assert torch.equal(value, plain_weights[-1][name])
    averager = setup.evaluation.__self__
    assert averager.steps == 3  # updated by the optimizer's step, inside Setup.step
    setup_before, _, _ = run({"start": 5}, 2)
    own = {n: p.detach().clone() for n, p in setup_before.model.named_parameters()}
    assert all(torch.equal(v, own[n]) for n, v in averaged(setup_before).items())


def test_the_convergence_run_keeps_it_and_evaluates_with_the_averages(monkeypatch):
    from training_harness.measure import convergence

    w = tiny_gpt()
    plan = Plan(micro_batch_size=8, global_batch_size=8, workload="gpt",
                strategies={"averaging": {"decay": 0.5}, "lars": {}, "fused": {}},
                target=TargetSpec(loss=0.0, max_samples=16, eval_every=8, eval_samples=8))
    assert set(maths_plan(plan).strategies) == {"averaging", "lars"}
    seen = []
    real = convergence.validation_loss

    def spy(model, *args, **kwargs):
        seen.append(next(model.parameters()).detach().clone())
        return real(model, *args, **kwargs)

    monkeypatch.setattr(convergence, "validation_loss", spy)
    run_ = train_to_target(plan.replace(strategies={"averaging": {"decay": 0.5}}), w,
                           torch.device("cpu"), None, 0)
    assert run_["steps"] == 2 and len(seen) == 3
    # at step 2 the evaluated weights are the average of steps 1 and 2, not step 2's
    assert not torch.equal(seen[2], seen[1])


@pytest.mark.parametrize("strategies, layout, words", [
    ({"zero": {}}, Layout(data=2), "zero stage 2 (FSDP2)"),
    ({"zero": {"stage": 3}}, Layout(data=2), "zero stage 3 (FSDP2)"),
    ({"tensor": {}}, Layout(tensor=2), "tensor parallel"),
])
def test_refusals_say_why(strategies, layout, words):
    strategy = get("averaging")
    plan = Plan(layout=layout, strategies={"averaging": {}, **strategies})
    reasons = strategy.check(strategy.parse({}), plan, CPU)
    assert len(reasons) == 1 and words in reasons[0], reasons
    ok = Plan(layout=Layout(data=2), strategies={"averaging": {}, "ddp": {}})
    assert strategy.check(strategy.parse({}), ok, CPU) == []


def test_strategy_registered_its_space_and_settings():
    strategy = get("averaging")
    assert isinstance(strategy, AveragingStrategy)
    assert strategy.phases == (Phase.STEP,)
    assert strategy.space() == {"method": Choice(("ema", "swa")), "decay": Choice((0.99, 0.999))}
    with pytest.raises(HarnessError, match="decay"):
        strategy.parse({"decay": 1.0})
    with pytest.raises(HarnessError, match="every"):
        strategy.parse({"every": 0})
    with pytest.raises(HarnessError, match="method"):
        strategy.parse({"method": "polyak"})
