"""Time to a target validation loss: the validation loss is honest, steps to target are
cached by the maths and reused only where the maths is unchanged, a miss is no success."""

from __future__ import annotations

import pytest
import torch

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.target import TargetSpec, maths_key
from training_harness.measure import convergence, time_to_target
from training_harness.measure.convergence import validation_loss
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.workloads import load_workload

TEXT = dict(layers=1, heads=2, hidden=32, seq_len=32, vocab=256, data="text")
PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))


def plan(**changes) -> Plan:
    base = Plan(name="ttl", workload="gpt", workload_args=TEXT, device="cpu",
                micro_batch_size=8, global_batch_size=16, warmup_steps=1, steps=2,
                strategies={"accumulation": {}},
                target=TargetSpec(loss=4.5, max_samples=256, eval_every=64, eval_samples=32))
    base.optimizer.lr = 1e-2
    return base.replace(**changes)


def run(p: Plan):
    return run_trial(prepare(p, peaks={"fp32": PEAK}), "test")


def test_the_validation_loss_of_a_trained_model_is_below_a_fresh_ones():
    w = load_workload("gpt", TEXT)
    torch.manual_seed(0)
    model = w.build_model()
    before = validation_loss(model, w, 64, "cpu")
    assert model.training and all(p.grad is None for p in model.parameters())  # no grad
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(10):  # 5.55 -> 3.50 here (40 steps: 3.29): the margin is 0.5
        opt.zero_grad()
        w.loss(model, w.batch(16, step, "cpu")).backward()
        opt.step()
    after = validation_loss(model, w, 64, "cpu")
    assert after < before - 0.5, (before, after)
    # the same held-out samples every time: measuring again gives the same figure
    assert validation_loss(model, w, 64, "cpu") == after


def test_the_maths_key_ignores_layout_and_kernels_not_what_changes_the_numbers():
    p = plan()
    key = maths_key(p.to_dict(), 0, "cpu")
    same = [
        p.replace(micro_batch_size=16, strategies={}),
        p.replace(micro_batch_size=4, strategies={"accumulation": {}, "checkpoint": {}}),
        p.replace(strategies={"accumulation": {}, "zero": {"stage": 2}, "pipeline": {}}),
        p.replace(workload_args={**TEXT, "attention": "sdpa"}),
    ]
    assert all(maths_key(q.to_dict(), 0, "cpu") == key for q in same)
    lamb = maths_key(p.replace(strategies={"lamb": {}}).to_dict(), 0, "cpu")
    assert maths_key(p.replace(strategies={"lamb": {"foreach": True}}).to_dict(), 0, "cpu") == lamb
    changed = [
        p.replace(global_batch_size=32),
        p.replace(strategies={"accumulation": {}, "lamb": {}}),
        p.replace(strategies={"accumulation": {}, "amp": {"dtype": "bf16"}}),
        p.replace(workload_args={**TEXT, "data": "synthetic"}),
        p.replace(target=TargetSpec(loss=4.5, max_samples=256, eval_every=64, eval_samples=32,
                                    warmup_samples=32)),
        p.replace(target=TargetSpec(loss=4.0, max_samples=256, eval_every=64, eval_samples=32)),
    ]
    lr = p.replace()
    lr.optimizer.lr = 3e-3
    changed.append(lr)
    keys = {maths_key(q.to_dict(), 0, "cpu") for q in changed}
    assert key not in keys and len(keys) == len(changed)
    assert maths_key(p.to_dict(), 1, "cpu") != key  # the seed
    assert maths_key(p.to_dict(), 0, "cuda") != key


def test_a_fine_tunings_saved_start_is_in_the_maths_key(tmp_path):
    """hf:/folder trains from the folder's weights: saved again there (another size or
    time), its runs to the target are another key; a hub name has no such part."""
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"0" * 8)
    p = plan().replace(workload=f"hf:{folder}", workload_args={"seq_len": 32})
    first = maths_key(p.to_dict(), 0, "cpu")
    assert '"start_weights": [["model.safetensors", 8' in first
    (folder / "model.safetensors").write_bytes(b"0" * 16)  # saved again
    assert maths_key(p.to_dict(), 0, "cpu") != first
    hub = maths_key(p.replace(workload="hf:llama").to_dict(), 0, "cpu")
    assert "start_weights" not in hub


def test_each_seed_draws_its_own_batches_and_seed_0_the_trials(monkeypatch):
    """The seed sets the data order as well as the weights: seed 0 trains on the
    workload's batches 0, 1, 2 ... (a trial's), seed 1 on its own stream."""
    p = plan(target=TargetSpec(loss=0.0, max_samples=32, eval_every=16, eval_samples=8))
    w = load_workload(p.workload, p.workload_args)
    drawn: list[int] = []
    real = w.batch

    def spy(batch_size, index, device):
        drawn.append(index)
        return real(batch_size, index, device)

    monkeypatch.setattr(w, "batch", spy)
    for seed in (0, 1):
        convergence.train_to_target(p, w, torch.device("cpu"), None, seed)
    steps = 32 // p.batch_size
    assert drawn == list(range(steps)) + [convergence.DATA_STRIDE + s for s in range(steps)]


def test_steps_to_target_are_cached_and_reused_only_where_the_maths_is_unchanged(monkeypatch):
    trained = []
    real = convergence.train_to_target

    def counting(p, *args):
        trained.append(p)
        return real(p, *args)

    monkeypatch.setattr(time_to_target, "train_to_target", counting)
    first = run(plan())
    assert first.status == "ok", first.reason
    conv = first.metrics["convergence"]
    assert conv["reached"] and not conv["runs"][0]["cached"] and len(trained) == 1
    steps = first.metrics["steps_to_target"]
    assert first.metrics["time_to_target_s"] == pytest.approx(
        steps * first.metrics["step_time_s"]["median"])
    # another micro-batch size, and checkpointing: the same maths, trained no more
    other = run(plan(micro_batch_size=16, strategies={"checkpoint": {}}))
    assert other.metrics["convergence"]["runs"][0]["cached"] and len(trained) == 1
    assert other.metrics["steps_to_target"] == steps
    assert other.metrics["time_to_target_s"] == pytest.approx(
        steps * other.metrics["step_time_s"]["median"])
    # LAMB changes the maths: trained again
    lamb = run(plan(strategies={"accumulation": {}, "lamb": {}}))
    assert not lamb.metrics["convergence"]["runs"][0]["cached"] and len(trained) == 2


def test_a_run_that_misses_the_target_is_not_a_success():
    missed = run(plan(target=TargetSpec(loss=0.01, max_samples=64, eval_every=32,
                                        eval_samples=16)))
    assert missed.status == "failed" and "not reached" in missed.reason
    conv = missed.metrics["convergence"]
    assert conv["reached"] is False and conv["runs"][0]["stopped"] == "max_samples"
    assert missed.metrics["time_to_target_s"] is None and missed.metrics["steps_to_target"] is None
    assert conv["best_val_loss"] > 0.01  # the loss it reached instead
    assert f"{conv['best_val_loss']:.4g}" in missed.reason


def test_lr_scaling_and_warm_up():
    spec = TargetSpec(loss=1.0, lr_scaling="sqrt", base_batch=16, warmup_samples=100)
    assert spec.lr(1e-3, 64) == pytest.approx(2e-3) and spec.warmup_steps(64) == 2
    assert TargetSpec(loss=1.0, lr_scaling="linear", base_batch=16).lr(1e-3, 64) == 4e-3
    mp = convergence.maths_plan(plan(micro_batch_size=4, strategies={"accumulation": {},
                                                                     "zero": {}}))
    assert mp.strategies == {"accumulation": {}} and mp.micro_batch_size == 4
    with pytest.raises(HarnessError, match="base_batch"):
        Plan.from_dict({"name": "x", "target": {"loss": 1.0, "lr_scaling": "linear"}})


def test_the_tuner_minimizes_time_to_target_and_never_counts_a_miss():
    import math

    from optuna.trial import TrialState

    from training_harness.tune.optuna_outcome import outcome

    hit = {"status": "ok", "metrics": {"time_to_target_s": 12.5, "peak_memory_bytes": 1}}
    got = outcome(hit, ["time_to_loss"], 2.0)
    assert got.state == TrialState.COMPLETE and got.values == [12.5] and got.feasible
    miss = {"status": "failed", "reason": "validation loss 2.5 not reached",
            "metrics": {"time_to_target_s": None, "peak_memory_bytes": 1}}
    got = outcome(miss, ["time_to_loss"], 2.0)
    assert got.values == [math.inf] and not got.feasible  # never the best
