"""Knowledge distillation: weight 0 is the plain loss, weight 1's gradient is the KL's,
the teacher is a saved workload (`--save`), only the student's FLOPs count, refusals
say why, and the teacher and the settings are in the maths key."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import TargetSpec, maths_key
from training_harness.measure import convergence
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload
from training_harness.workloads.trained import load_trained, save_trained

STUDENT = dict(layers=1, heads=2, hidden=32, seq_len=16, vocab=64)
TEACHER = dict(layers=2, heads=2, hidden=48, seq_len=32, vocab=64)
PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}
CPU = RuntimeEnv.detect("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: tiny models gain nothing from two, and on a shared machine
    two threads spin-wait on each other (steps of 1 s instead of 10 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    """A larger gpt, trained a few steps, saved as `harness bench --save` saves it."""
    w = load_workload("gpt", TEACHER)
    torch.manual_seed(1)
    model = w.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i in range(3):
        w.loss(model, w.batch(8, i, "cpu")).backward()
        opt.step()
        opt.zero_grad()
    return save_trained(model, "gpt", TEACHER, tmp_path_factory.mktemp("teacher"))


def plan(teacher: str, **settings) -> Plan:
    return Plan(workload="gpt", workload_args=STUDENT, device="cpu", micro_batch_size=4,
                warmup_steps=1, steps=2, strategies={"distill": {"teacher": teacher, **settings}})


def student_loss(teacher: str, **settings):
    """(the student, the workload, the distillation loss function compose made)."""
    p = plan(teacher, **settings)
    w = load_workload("gpt", STUDENT)
    torch.manual_seed(0)
    setup = compose(w.build_model(), p, "cpu")
    return setup.model, w, setup.loss_override(w.loss)


def test_saved_weights_come_back_the_same(teacher):
    w, model = load_trained(teacher)
    assert w.cfg.layers == 2 and w.cfg.hidden == 48
    batch = load_workload("gpt", TEACHER).batch(2, 0, "cpu")
    again = load_trained(teacher)[1]
    assert torch.equal(model(batch[0]), again(batch[0]))


def test_weight_0_is_the_plain_loss(teacher):
    model, w, loss = student_loss(teacher, weight=0.0)
    batch = w.batch(4, 0, "cpu")
    assert loss(model, batch).item() == pytest.approx(w.loss(model, batch).item(), abs=1e-6)


def test_weight_1_has_the_gradient_of_the_kl_to_the_softened_teacher(teacher):
    t = 3.0
    model, w, loss = student_loss(teacher, weight=1.0, temperature=t)
    ids, _ = w.batch(4, 0, "cpu")
    loss(model, (ids, w.batch(4, 0, "cpu")[1])).backward()
    mixed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, teach = load_trained(teacher)
    with torch.no_grad():
        p_t = F.softmax(teach(ids).double() / t, dim=-1)
    log_s = F.log_softmax(model(ids).double() / t, dim=-1)
    # T^2 x KL(p_t || p_s), averaged over the positions, computed by hand in float64
    kl = (p_t * (p_t.log() - log_s)).sum(-1).mean() * t * t
    kl.backward()
    for a, b in zip(mixed, model.parameters(), strict=True):
        torch.testing.assert_close(a, b.grad.float(), rtol=1e-4, atol=1e-7)


def test_a_trial_counts_the_students_flops_only_and_says_so(teacher, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    saved = tmp_path / "student"  # and `harness bench --save`'s plan.save: the student
    result = run_trial(prepare(plan(teacher).replace(save=str(saved)), peaks={"fp32": PEAK}),
                       "test")
    assert result.status == "ok", result.reason
    assert result.metrics["saved"] == str(saved) and load_trained(saved)[0].cfg.layers == 1
    student = load_workload("gpt", STUDENT).flops_per_sample()
    assert result.metrics["flops_per_step"] == pytest.approx(4 * student)
    note = next(n for n in result.metrics["notes"] if n.startswith("distill"))
    assert "MFU count the student only" in note and "in the step time" in note


def test_refused_with_the_reason(teacher, tmp_path):
    def reasons(p):
        return " ".join(reasons_against(p, CPU))

    assert "name the teacher" in reasons(plan(""))
    assert "harness bench ... --save" in reasons(plan(str(tmp_path)))  # not a saved folder
    assert "vocabulary (64) is not the student's (128)" in reasons(
        plan(teacher).replace(workload_args={**STUDENT, "vocab": 128}))
    assert "sequences of 32 tokens at most" in reasons(
        plan(teacher).replace(workload_args={**STUDENT, "seq_len": 64}))
    assert "not a language model" in reasons(plan(teacher).replace(workload="mlp",
                                                                   workload_args={}))
    tp = plan(teacher).replace(layout=Layout(tensor=2), strategies={
        "distill": {"teacher": teacher}, "tensor": {}})
    assert "not with tensor parallel or the pipeline" in reasons(tp)
    with pytest.raises(HarnessError, match="save"):
        Plan.from_dict({"save": str(tmp_path), "layout": {"data": 2}})
    pytest.importorskip("transformers")
    from training_harness.workloads import optional

    config = optional.transformers().LlamaConfig(
        vocab_size=64, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
        num_attention_heads=2)
    config.save_pretrained(tmp_path / "cfg")  # a config, no weights
    assert "has no weights" in reasons(plan(f"hf:{tmp_path / 'cfg'}"))


def test_the_settings_and_the_teachers_weights_are_in_the_maths_key(teacher):
    keys = {maths_key(plan(teacher).replace(strategies={}).to_dict(), 0, "cpu")}
    for settings in ({}, {"weight": 0.9}, {"temperature": 4.0}):
        keys.add(maths_key(plan(teacher, **settings).to_dict(), 0, "cpu"))
    assert len(keys) == 4
    before = maths_key(plan(teacher).to_dict(), 0, "cpu")
    weights = os.path.join(teacher, "model.safetensors")
    stat = os.stat(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # saved again
    assert maths_key(plan(teacher).to_dict(), 0, "cpu") != before
    kept = convergence.maths_plan(plan(teacher).replace(target=TargetSpec(loss=1.0)))
    assert kept.strategies["distill"] == {"teacher": teacher}  # trained with it


def test_the_estimate_holds_the_teacher_and_times_its_forward(teacher):
    """The teacher's fp32 weights and the three logits tensors its KL keeps are in the
    predicted peak; its forward (2 FLOPs per parameter and token) is in the predicted
    step time, never in the model FLOPs."""
    from training_harness.estimator.estimate import estimate

    p = plan(teacher)
    student = load_workload(p.workload, p.workload_args)
    with_teacher = estimate(p, student, CPU, peak_flops=1e12)
    alone = estimate(p.replace(strategies={}), student, CPU, peak_flops=1e12)
    n = sum(q.numel() for q in load_workload("gpt", TEACHER).build_model().parameters())
    kept = 3 * 4 * 16 * 64 * 4  # micro-batch x seq_len x vocab, fp32
    assert with_teacher.memory["distill_teacher"] == n * 4 + kept
    assert alone.memory["distill_teacher"] == 0
    assert with_teacher.peak_memory_bytes - alone.peak_memory_bytes == n * 4 + kept
    assert with_teacher.flops_per_step == alone.flops_per_step  # MFU: the student's
    assert with_teacher.step_time_s > alone.step_time_s
    assert any(a.startswith("distill: the teacher's") for a in with_teacher.assumptions)
