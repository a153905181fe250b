"""The sequence-length curriculum: each step's length follows the schedule, its FLOPs and
tokens are counted at that length, it is refused where inputs are fixed, and it changes
the maths key."""

from __future__ import annotations

import pytest
import torch

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.core.target import TargetSpec, maths_key
from training_harness.measure import convergence
from training_harness.measure import length_times as lt
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.strategies.compose import compose, reasons_against
from training_harness.strategies.curriculum import CurriculumSettings, Schedule
from training_harness.workloads import load_workload
from training_harness.workloads.gpt import GPTConfig, GPTWorkload

ARGS = dict(layers=1, heads=2, hidden=32, seq_len=64, vocab=64)
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


def plan(settings=None, **changes) -> Plan:
    base = Plan(workload="gpt", workload_args=ARGS, device="cpu", micro_batch_size=4,
                warmup_steps=2, steps=6,
                strategies={"curriculum": {"start": 8, "samples": 64, **(settings or {})}})
    return base.replace(**changes)


def test_the_schedules_lengths():
    linear = Schedule(CurriculumSettings(start=8, samples=64, multiple=8), full=64, batch=4)
    # seen = 4 i samples; 8 + 56 x seen / 64, rounded down to a multiple of 8
    assert [linear.length(i) for i in range(18)] == [
        8, 8, 8, 16, 16, 24, 24, 32, 32, 32, 40, 40, 48, 48, 56, 56, 64, 64]
    stepped = Schedule(CurriculumSettings(start=16, samples=64, schedule="stepped", stages=4,
                                          multiple=1), full=64, batch=8)
    # 4 stages of 16 samples (2 steps each): 16, 28, 40, 52, then the full 64
    assert [stepped.length(i) for i in range(10)] == [16, 16, 28, 28, 40, 40, 52, 52, 64, 64]
    # a start at the full length: no curriculum at all
    assert Schedule(CurriculumSettings(start=64), full=64, batch=4).length(0) == 64


def test_each_step_runs_at_its_scheduled_length_and_its_flops_are_counted_there():
    p = plan()
    w = load_workload(p.workload, p.workload_args)
    torch.manual_seed(0)
    setup = compose(w.build_model(), p, "cpu")
    schedule = Schedule(CurriculumSettings(start=8, samples=64), full=64, batch=4)
    lengths = []

    def loss(model, batch):
        lengths.append((batch[0].shape[1], batch[1].shape[1]))
        return w.loss(model, batch)

    for i in range(18):
        assert torch.isfinite(setup.step([w.batch(4, i, "cpu")], loss))
    assert lengths == [(schedule.length(i),) * 2 for i in range(18)]
    for i in (0, 5, 17):
        n = schedule.length(i)
        flops, tokens = setup.work_at(i)
        assert tokens == n
        assert flops == GPTWorkload(GPTConfig(**{**ARGS, "seq_len": n})).flops_per_sample()
        # 6N + 12·L·H·T per token, T tokens (N without the position table)
        params = sum(q.numel() for q in setup.model.parameters()) - 64 * 32
        assert flops == (6 * params + 12 * 1 * 32 * n) * n


def test_a_trials_throughput_and_mfu_count_the_measured_steps_lengths(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    p = plan()
    result = run_trial(prepare(p, peaks={"fp32": PEAK}), "test")
    assert result.status == "ok", result.reason
    m = result.metrics
    first, n = m["window"]["warmup_steps_run"], m["window"]["steps"]
    schedule = Schedule(CurriculumSettings(start=8, samples=64), full=64, batch=4)
    lengths = [schedule.length(i) for i in range(first, first + n)]
    assert max(lengths) < 64  # the window ran shorter sequences
    per_sample = [GPTWorkload(GPTConfig(**{**ARGS, "seq_len": k})).flops_per_sample()
                  for k in lengths]
    assert m["flops_per_step"] == pytest.approx(4 * sum(per_sample) / n)
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * sum(lengths) / n)
    assert any(note.startswith("curriculum (linear)") for note in m["notes"])


def test_refused_with_the_reason_where_inputs_are_fixed_or_the_length_cannot_change():
    def reasons(p):
        return " ".join(reasons_against(p, CPU))

    assert "fixed size" in reasons(plan(workload="mlp", workload_args={}))
    assert "fixed size" in reasons(plan(workload="vit", workload_args={}))
    assert "longer than the workload's seq_len 64" in reasons(plan({"start": 128}))
    assert "pipeline" in reasons(plan(strategies={"curriculum": {}, "pipeline": {}}))
    pytest.importorskip("transformers")
    bert = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                num_attention_heads=2, vocab_size=64, seq_len=32)
    assert "masked LM" in reasons(plan(workload="hf:bert", workload_args=bert))
    llama = {**bert, "num_key_value_heads": 2}
    assert reasons(plan(workload="hf:llama", workload_args=llama)) == ""


def test_an_hf_causal_lm_trains_on_the_shorter_sequences():
    pytest.importorskip("transformers")
    llama = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                 num_attention_heads=2, num_key_value_heads=2, vocab_size=64, seq_len=32)
    p = plan(workload="hf:llama", workload_args=llama)
    w = load_workload(p.workload, p.workload_args)
    setup = compose(w.build_model(), p, "cpu")
    seen = []
    setup.step([w.batch(4, 0, "cpu")], lambda m, b: seen.append(b[0].shape) or w.loss(m, b))
    assert seen == [torch.Size([4, 8])]
    assert setup.work_at(0) == (w.__class__.flops_per_sample(_at(w, 8)), 8.0)


def _at(workload, n):
    import copy

    short = copy.copy(workload)
    short.seq_len = n
    return short


def test_the_curriculum_has_its_own_maths_key():
    base = plan(strategies={}).to_dict()
    keys = {maths_key(base, 0, "cpu")}
    for settings in ({}, {"start": 16}, {"schedule": "stepped"}, {"samples": 128}):
        keys.add(maths_key(plan(settings).to_dict(), 0, "cpu"))
    assert len(keys) == 5
    kept = convergence.maths_plan(plan().replace(target=TargetSpec(loss=1.0)))
    assert kept.strategies["curriculum"] == {"start": 8, "samples": 64}  # trained with it


def test_the_lengths_timed_are_the_schedules_first_full_and_evenly_between():
    # 16, 24, ..., 64: seven lengths, thinned to five with the first and the full kept
    schedule = Schedule(CurriculumSettings(start=16, samples=2048), full=64, batch=16)
    assert lt.lengths_to_time(schedule) == [16, 32, 40, 56, 64]
    # 8, 16, ..., 64: indices 0, 1.75, 3.5, 5.25, 7 rounded half up
    short = Schedule(CurriculumSettings(start=8, samples=64), full=64, batch=4)
    assert lt.lengths_to_time(short) == [8, 24, 40, 48, 64]
    few = Schedule(CurriculumSettings(start=48, samples=64), full=64, batch=4)
    assert lt.lengths_to_time(few) == [48, 56, 64]


def test_a_runs_time_adds_each_steps_time_at_its_length():
    times = {8: 1.0, 64: 8.0}  # linear in between: 1 + 7 (n - 8) / 56
    assert lt.step_time_at(times, 8) == 1.0 and lt.step_time_at(times, 64) == 8.0
    assert lt.step_time_at(times, 36) == pytest.approx(4.5)
    assert lt.step_time_at(times, 4) == 1.0 and lt.step_time_at(times, 128) == 8.0
    schedule = Schedule(CurriculumSettings(start=8, samples=64), full=64, batch=4)
    by_hand = sum(1 + 7 * (schedule.length(i) - 8) / 56 for i in range(20))
    assert lt.run_seconds(times, schedule.length, 20) == pytest.approx(by_hand)


def test_a_target_trials_time_to_target_counts_each_step_at_its_length(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    target = TargetSpec(loss=4.0, max_samples=256, eval_every=16, eval_samples=16, seeds=[0])
    result = run_trial(prepare(plan(target=target), peaks={"fp32": PEAK}), "test")
    assert result.status == "ok", result.reason
    m = result.metrics
    measured = m["step_time_by_length_s"]
    schedule = Schedule(CurriculumSettings(start=8, samples=64), full=64, batch=4)
    assert sorted(measured) == lt.lengths_to_time(schedule)
    assert all(t > 0 for t in measured.values())
    conv = m["convergence"]
    steps = conv["steps_to_target"]
    assert m["time_to_target_s"] == pytest.approx(
        lt.run_seconds(measured, schedule.length, int(steps)))
    assert conv["window_step_time_s"] == m["step_time_s"]["median"]
    assert conv["step_time_s"] == pytest.approx(m["time_to_target_s"] / steps)
    assert conv["technique"] == "adamw + curriculum"
    from training_harness.cli.bench_table import result_table

    assert "step by length    length 8: " in result_table(result.to_dict())
