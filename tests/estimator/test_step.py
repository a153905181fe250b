"""The estimator's whole step: the peak against a live count of a CPU training step,
step time, the record, the optimizer's temporaries, settings."""

from __future__ import annotations

import pytest
import torch

from tests.estimator.measure import LiveBytes
from tests.estimator.models import CPU, CUDA, TinyGPTWorkload, expected_parameters, gpt_plan
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout
from training_harness.estimator import COMPONENTS, estimate
from training_harness.estimator.bandwidth import bandwidth
from training_harness.estimator.result import STEP_PARTS
from training_harness.estimator.step_costs import COMPUTE_MFU, DATA_EXPOSED


@pytest.mark.parametrize(
    ("attention", "amp", "every"),
    [("explicit", False, None), ("sdpa", True, None), ("explicit", False, 1)],
)
def test_peak_matches_a_live_count_of_a_training_step(attention, amp, every):
    from torch.utils.checkpoint import checkpoint

    w = TinyGPTWorkload(layers=3, hidden=96, heads=3, seq_len=64, vocab=2000, attention=attention)
    strategies = {"amp": {}} if amp else {}
    if every:
        strategies["checkpoint"] = {"every": every}
    e = estimate(gpt_plan(attention, micro_batch=4, **strategies), w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    for i, block in enumerate(model.blocks):
        if every and i % every == 0:
            block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(
                block.forward
            )
    opt = torch.optim.AdamW(model.parameters())
    batch = w.batch(4, 0, "cpu")
    for _ in range(2):  # the second step has optimizer state, like every later one
        kept = [*model.parameters(), *(t for st in opt.state.values() for t in st.values())]
        with LiveBytes({t.untyped_storage().data_ptr() for t in kept}) as live:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = w.loss(model, batch)
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad()
    persistent = sum(e.memory[k] for k in ("parameters", "optimizer_state", "buffers"))
    predicted = e.peak_memory_bytes - persistent
    assert predicted == pytest.approx(live.peak, rel=0.08)
    assert e.upper_bound_bytes >= e.peak_memory_bytes


# --- step time, records, settings ---------------------------------------------------------


def test_step_time_scales_with_the_global_batch():
    w = TinyGPTWorkload()
    one = estimate(gpt_plan(micro_batch=4), w, CPU, peak_flops=1e12)
    plan = gpt_plan(micro_batch=4, accumulation={})
    plan.global_batch_size = 16
    four = estimate(plan, w, CPU, peak_flops=1e12)
    assert four.step_time_s == pytest.approx(4 * one.step_time_s)
    assert four.flops_per_step == pytest.approx(4 * one.flops_per_step)
    assert one.step_time_s == pytest.approx(w.flops_per_sample() * 4 / (1e12 * 0.5))
    # Activations are per micro-batch: accumulation leaves them alone.
    assert four.memory["activations"] == one.memory["activations"]
    # On a GPU whose compute dominates (a slow one), the same, at the compute MFU
    slow = estimate(gpt_plan(micro_batch=4), w, CUDA, peak_flops=1e9)
    slow4 = estimate(plan, w, CUDA, peak_flops=1e9)
    assert slow4.step_time_s == pytest.approx(4 * slow.step_time_s, rel=0.02)
    assert slow.step_time_s == pytest.approx(w.flops_per_sample() * 4 / (1e9 * COMPUTE_MFU),
                                             rel=0.02)


def test_a_small_micro_batch_is_launch_bound_on_a_gpu():
    """Fast compute: the step takes the kernel launches' time, so per sample a micro-batch
    of 1 is slower than one of 4 at the same global batch, and compile (fewer kernels)
    helps it."""
    w = TinyGPTWorkload()
    def step(micro, **strategies):
        plan = gpt_plan(micro_batch=micro, accumulation={}, **strategies)
        plan.global_batch_size = 8
        return estimate(plan, w, CUDA, peak_flops=1e15).step_time_s
    assert step(1) > 2 * step(4)  # 8 micro-steps' launches against 2
    # compile fuses a block's element-wise kernels (COMPILED_KERNELS of them are left);
    # the embedding's, the head's and the loss's stay: 2 x 13.5 + 40 of 2 x 45 + 40
    assert step(1, fused={"compile": True}) == pytest.approx(step(1) * 67 / 130, rel=0.02)


def test_torchs_default_optimizer_is_foreach_on_plain_cuda_tensors():
    """torch's AdamW with no implementation asked for runs foreach on CUDA (the for-loop
    only for FSDP2's DTensors): the default plan's optimizer step costs what foreach's
    does, not a for-loop's launches."""
    w = TinyGPTWorkload()

    def optimizer_s(impl=None, **strategies):
        fused = {"fused": {"optimizer": impl}} if impl else {}
        plan = gpt_plan(micro_batch=4, **fused, **strategies)
        return estimate(plan, w, CUDA, peak_flops=1e15).step_parts["optimizer"]

    assert optimizer_s() == pytest.approx(optimizer_s("foreach"), rel=1e-6)
    assert optimizer_s() > optimizer_s("fused")
    plan = gpt_plan(micro_batch=4, zero={"stage": 3})
    plan.layout = Layout(data=2)
    sharded = estimate(plan, w, CUDA, peak_flops=1e15)
    assert any("optimizer step" in a for a in sharded.assumptions)
    assert sharded.step_parts["optimizer"] > optimizer_s("foreach") / 2  # the loop, on half


def test_data_and_tensor_parallel_traffic_on_a_gpu():
    w = TinyGPTWorkload()
    one = estimate(gpt_plan(micro_batch=4), w, CUDA, peak_flops=1e12)
    plan = gpt_plan(micro_batch=4, ddp={})
    plan.layout = Layout(data=2)  # global batch 8 over 2 ranks: the same work per rank
    two = estimate(plan, w, CUDA, peak_flops=1e12)
    assert two.flops_per_step == pytest.approx(2 * one.flops_per_step)
    grads = two.memory["parameters"]  # fp32: the gradients' bytes
    link = bandwidth("cuda", CUDA.device_name).link
    assert two.step_time_s - one.step_time_s == pytest.approx(
        DATA_EXPOSED * 2 * 0.5 * grads / link, rel=0.05)
    assert any("data-parallel traffic" in a for a in two.assumptions)
    cpu = estimate(gpt_plan(micro_batch=4), w, CPU, peak_flops=1e12)
    cpu2 = estimate(plan, w, CPU, peak_flops=1e12)
    assert cpu2.step_time_s == pytest.approx(cpu.step_time_s)  # the CPU counts FLOPs only
    tp = gpt_plan(micro_batch=4, tensor={})
    tp.layout = Layout(tensor=2)
    assert any("tensor-parallel all-reduces" in a
               for a in estimate(tp, w, CUDA, peak_flops=1e12).assumptions)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_step_parts_add_up_to_the_step_time(device):
    """The search re-weights the estimator's parts (training_harness.tune.model.part_fit): they
    must be the step, by the rule STEP_PARTS states."""
    env = CUDA if device == "cuda" else CPU
    plan = gpt_plan(micro_batch=2, accumulation={}, checkpoint={"every": 1}, ddp={})
    plan.global_batch_size = 8
    plan.layout = Layout(data=2)
    e = estimate(plan, TinyGPTWorkload(), env, peak_flops=1e13)
    p = e.step_parts
    assert set(p) <= set(STEP_PARTS) and all(v >= 0 for v in p.values())
    assert p["recompute"] > 0  # checkpointed: every block's forward again
    busy = p["compute"] + p["recompute"] + p["bubble"]
    step = max(busy, p.get("launches", 0.0)) + sum(p.get(k, 0.0) for k in
                                                  ("data", "tensor", "optimizer"))
    assert step == pytest.approx(e.step_time_s, rel=1e-9)
    assert (p.get("data", 0.0) > 0) == (device == "cuda")  # the CPU counts FLOPs only
    assert e.to_record()["step_parts"] == p


def test_without_a_peak_there_is_no_step_time():
    e = estimate(gpt_plan(), TinyGPTWorkload(), CPU)
    assert e.step_time_s is None
    assert e.flops_per_step > 0


def test_record_and_peak():
    e = estimate(gpt_plan(amp={}, checkpoint={"every": 2}), TinyGPTWorkload(), CUDA, 1e12)
    record = e.to_record()
    assert {"peak_memory_bytes", "step_time_s", "memory", "flops_per_step", "assumptions"} <= set(
        record
    )
    assert set(record["memory"]) == set(COMPONENTS)
    persistent = sum(e.memory[k] for k in ("parameters", "optimizer_state", "buffers"))
    assert e.peak_memory_bytes == persistent + max(e.phases.values())
    assert e.upper_bound_bytes == sum(e.memory.values()) >= e.peak_memory_bytes
    assert all(isinstance(a, str) and a for a in e.assumptions)
    assert "peak memory" in e.summary()


def test_optimizer_implementation_sets_the_step_temporaries():
    w = TinyGPTWorkload()
    psi = expected_parameters(w)
    temporaries = {
        name: estimate(gpt_plan(**strategies), w, CUDA).memory["optimizer_temporaries"]
        for name, strategies in {
            "default": {},  # torch's AdamW picks foreach on CUDA
            "fused": {"fused": {}},  # the fused strategy's default optimizer
            "triton": {"fused": {"optimizer": "triton"}},
            "lamb foreach": {"lamb": {}, "fused": {"optimizer": "foreach"}},
            "lamb clipped": {"lamb": {"max_grad_norm": 1.0}, "fused": {"optimizer": "foreach"}},
        }.items()
    }
    assert temporaries == {
        "default": 4 * psi, "fused": 0, "triton": 0,
        "lamb foreach": 8 * psi, "lamb clipped": 12 * psi,
    }


@pytest.mark.parametrize(
    "strategies",
    [
        {"amp": {"dtype": "fp8"}},
        {"checkpoint": {"every": 0}},
        {"fused": {"attention": "flash"}},
        {"checkpoint": {"evry": 2}},
        {"no_such_strategy": {}},
    ],
)
def test_bad_settings_are_harness_errors(strategies):
    with pytest.raises(HarnessError):
        estimate(gpt_plan(**strategies), TinyGPTWorkload(), CPU)


def test_summary_reads_well():
    text = estimate(gpt_plan(amp={}), TinyGPTWorkload(), CPU, peak_flops=1e11).summary()
    assert "peak memory" in text and "step time" in text and "KiB" in text


def test_float8_is_said_to_be_estimated_as_the_plan_without_it():
    """The estimator models neither float8's fp8 matmuls nor its casts (the H200 page:
    2.7x the bf16 step eager): its estimate equals the plan's without float8, and says so."""
    w = TinyGPTWorkload()
    plain = estimate(gpt_plan(micro_batch=4, amp={"dtype": "bf16"}), w, CUDA,
                     peak_flops=1e15)
    fp8 = estimate(gpt_plan(micro_batch=4, amp={"dtype": "bf16"},
                            float8={"recipe": "rowwise"}), w, CUDA, peak_flops=1e15)
    assert fp8.step_time_s == pytest.approx(plain.step_time_s)
    said = [a for a in fp8.assumptions if a.startswith("float8 (rowwise) is estimated as")]
    assert said and "learns it from the study's trials" in said[0]
    assert not any(a.startswith("float8") for a in plain.assumptions)
