"""The step time from a device profile: the operators a step traces, the profile's lookups,
the sum they make, and the profile measured here used by `harness estimate`.

The figures (how close a profiled step comes to a measured one) are a benchmark's, on a
quiet machine: tests/benchmarks/estimator_validation.py and its page in docs/benchmarks/.
Here the profile is synthetic where a sum is checked, so that nothing depends on this
machine's speed; the one test with a measured profile bounds the error at 10x either way,
which catches a unit slip (a millisecond for a microsecond), not an imprecision.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from tests.tiny import TINY_GPT
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.estimator import estimate
from training_harness.estimator.op_trace import Op, trace_callable, trace_step
from training_harness.estimator.profiled_step import DeviceProfile, op_seconds, profiled_step
from training_harness.workloads import load_workload

RATE = 1e10  # FLOP/s of the synthetic profile's every matmul
BANDWIDTH = 1e9  # bytes/s of its every elementwise operator


CONV_RATE = RATE / 4  # its convolutions: slower than the GEMM of the same shape


def synthetic(op_overhead_s: float = 0.0, first_touch_s_per_byte: float = 0.0
              ) -> DeviceProfile:
    dims = (16, 256, 4096)
    grid = [[m, n, k, 2 * m * n * k / RATE] for m in dims for n in dims for k in dims]
    # a convolution's k is 9 x its channels: axes of their own
    conv = [[m, n, k, 2 * m * n * k / CONV_RATE] for m in (256, 16384) for n in (16, 256)
            for k in (144, 2304)]
    table = [[b, b / BANDWIDTH] for b in (1e3, 1e6, 1e9)]
    return DeviceProfile({
        "schema": 4, "device_type": "cpu", "device_name": "synthetic", "threads": 1,
        "torch": torch.__version__, "measured_at": "-",
        "matmul": {"fp32": grid, "bf16": [[*r[:3], r[3] / 2] for r in grid]},
        "elementwise": {"fp32": {**{k: table for k in ("binary", "transcendental", "norm",
                                                       "softmax", "reduction")},
                                 "view": [[0, 1e-7]]}},
        "attention": {"fp32": {
            "causal": {"forward": [[64, 1e-5], [1024, 1e-5 * 256]],
                       "backward": [[64, 2e-5], [1024, 2e-5 * 256]]},
            "full": {"forward": [[64, 2e-5], [1024, 2e-5 * 256]],
                     "backward": [[64, 4e-5], [1024, 4e-5 * 256]]}}},
        "convolution": {"fp32": {"forward": conv, "input": conv,
                                 "weight": [[*r[:3], r[3] * 2] for r in conv]}},
        "optimizer": {"adamw-default": [1e-5, 1e-9]},
        "op_overhead_s": op_overhead_s, "first_touch_s_per_byte": first_touch_s_per_byte,
    })


def gpt_plan(**fields) -> Plan:
    return Plan.from_dict({"workload": {"name": "gpt", **TINY_GPT}, "micro_batch_size": 4,
                           "device": "cpu", **fields})


def test_a_matmul_costs_its_flops_at_the_profiles_rate_between_and_beyond_grid_points():
    profile = synthetic()
    for m, n, k in ((16, 16, 16), (100, 300, 50), (8192, 8192, 8192), (3, 5, 7)):
        assert profile.matmul_s(m, n, k, 4) == pytest.approx(2 * m * n * k / RATE, rel=1e-9)
    assert profile.matmul_s(256, 256, 256, 2) == pytest.approx(2 * 256**3 / RATE / 2)


def test_interpolation_follows_a_rate_that_grows_with_the_shape():
    dims = (16, 256, 4096)
    # the rate grows with the smallest dimension: 1 GFLOP/s at 16, 100 at 4096
    grid = [[m, n, k, 2 * m * n * k / (1e9 * min(m, n, k) ** (math.log(100) / math.log(256)))]
            for m in dims for n in dims for k in dims]
    profile = synthetic()
    profile = DeviceProfile({**profile.data, "matmul": {"fp32": grid}})
    rates = [2 * d**3 / profile.matmul_s(d, d, d, 4) for d in (16, 64, 256, 1024, 4096, 16384)]
    assert rates == sorted(rates)
    assert rates[-1] == pytest.approx(rates[-2])  # beyond the grid: the largest measured rate


def test_the_elementwise_table_is_interpolated_by_bytes_and_extended_at_its_bandwidth():
    profile = synthetic()
    for nbytes in (1e3, 3e4, 1e9, 1e10):
        assert profile.elementwise_s("norm", int(nbytes)) == pytest.approx(nbytes / BANDWIDTH)
    assert profile.elementwise_s("norm", 10) == pytest.approx(1e3 / BANDWIDTH)  # the floor


def test_a_step_is_its_operators_the_host_overhead_and_the_optimizer():
    profile = synthetic(op_overhead_s=2e-6)
    ops = [Op("matmul", 256, 256, 256, count=3), Op("binary", bytes=10**6, count=5),
           Op("view", count=10)]
    step = profiled_step(ops, microsteps=2, optimizer="adamw-default", tensors=10,
                         elements=1000, profile=profile)
    micro = 3 * 2 * 256**3 / RATE + 5 * 1e6 / BANDWIDTH + 10 * 1e-7 + 18 * 2e-6
    assert step.seconds == pytest.approx(2 * micro + 10 * 1e-5 + 1000 * 1e-9)
    assert step.parts["launches"] == pytest.approx(2 * 18 * 2e-6)
    # an optimizer the profile lacks is costed as AdamW's default, and named
    assert "adamw-default" in profiled_step(ops, 1, "muon-default", 1, 1, profile).how


def test_the_trace_sees_each_linear_as_three_matmuls_of_its_shape():
    model = torch.nn.Linear(32, 64)
    x = torch.randn(8, 32, requires_grad=True)
    ops = trace_callable(lambda: model(x).sum().backward())
    matmuls = sorted((op.m, op.n, op.k) for op in ops if op.kind == "matmul")
    # forward (8x32 @ 32x64), the input's gradient (8x64 @ 64x32), the weight's (64x8 @ 8x32)
    assert matmuls == sorted([(8, 64, 32), (8, 32, 64), (64, 32, 8)])


def test_the_trace_of_a_plan_follows_its_strategies():
    workload = load_workload("gpt", TINY_GPT)

    def count(kind: str, **strategies) -> int:
        ops = trace_step(gpt_plan(strategies=strategies), workload, 4)
        return sum(op.count for op in ops if op.kind == kind)

    plain = count("matmul")
    # every block's forward runs again in backward: its matmuls once more
    assert count("matmul", checkpoint={"every": 1}) > plain
    # under bf16 autocast the matmuls run on 2-byte operands
    bf16 = trace_step(gpt_plan(strategies={"amp": {"dtype": "bf16"}}), workload, 4)
    assert {op.itemsize for op in bf16 if op.kind == "matmul"} == {2}
    # SDPA in place of the explicit attention: attention operators, fewer matmuls
    assert count("attention_forward", fused={"attention": "sdpa"}) == TINY_GPT["layers"]
    assert count("matmul", fused={"attention": "sdpa"}) < plain


def test_the_estimate_uses_a_profile_and_says_so_and_accumulation_repeats_the_micro_step():
    workload = load_workload("gpt", TINY_GPT)
    env = RuntimeEnv.detect("cpu")
    one = estimate(gpt_plan(), workload, env, 1e11, profile=synthetic())
    four = estimate(gpt_plan(global_batch_size=16), workload, env, 1e11, profile=synthetic())
    assert any("device profile of synthetic" in a for a in one.assumptions)
    opt = one.step_parts["optimizer"]
    assert four.step_time_s - opt == pytest.approx(4 * (one.step_time_s - opt), rel=1e-6)
    without = estimate(gpt_plan(), workload, env, 1e11)
    assert not any("device profile" in a for a in without.assumptions)


def test_a_plan_on_several_devices_keeps_the_estimate_without_the_profile_and_says_why():
    plan = gpt_plan(layout={"data": 2}, strategies={"ddp": {}})
    e = estimate(plan, load_workload("gpt", TINY_GPT), RuntimeEnv.detect("cpu"), 1e11,
                 profile=synthetic())
    assert any("profile was not used: the profile holds no communication" in a
               for a in e.assumptions)


@pytest.mark.timeout(300)
def test_a_profile_measured_here_predicts_a_measured_step_within_ten_times(tmp_path):
    """One thread in the profile and in the step: the suite runs beside other tests, and a
    parallel region whose second thread waits for a busy core stalls for a time slice."""
    import os

    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "training_harness", "calibrate", "--quick",
                           "--out", str(tmp_path / "profile.json")],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "host overhead per operator" in done.stdout
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["threads"] == 1 and "fp32" in profile["matmul"]
    assert profile["op_overhead_s"] >= 0

    from training_harness.measure.batches import split_batch
    from training_harness.measure.device_profile import timed
    from training_harness.strategies.compose import compose

    workload = load_workload("gpt", TINY_GPT)
    plan = gpt_plan()
    torch.manual_seed(0)
    setup = compose(workload.build_model(), plan, "cpu")
    batch = split_batch(workload.batch(4, 0, "cpu"), 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = timed(lambda: setup.step(batch, workload.loss), torch.device("cpu"), 0.2)
    finally:
        torch.set_num_threads(threads)
    predicted = estimate(plan, workload, RuntimeEnv.detect("cpu"), 1e11,
                         profile=DeviceProfile(profile)).step_time_s
    assert 0.1 < predicted / measured < 10, (predicted, measured)


def test_op_seconds_of_attention_scales_with_rows_and_head_dim():
    profile = synthetic()
    one = op_seconds(Op("attention_forward", 1, 64, 64), profile)
    assert op_seconds(Op("attention_forward", 8, 64, 128), profile) == pytest.approx(16 * one)
    assert op_seconds(Op("attention_forward", 1, 64, 64, causal=False), profile) == \
        pytest.approx(2 * one)


def test_a_convolution_is_costed_from_the_convolution_table_not_the_gemm():
    profile = synthetic()
    flops = 2 * 1000 * 64 * 576
    forward = op_seconds(Op("convolution", 1000, 64, 576), profile)
    assert forward == pytest.approx(flops / CONV_RATE)
    # backward: the gradients it computes, each from its own table (the weight's at half)
    assert op_seconds(Op("convolution_backward_input_weight", 1000, 64, 576), profile) == \
        pytest.approx(3 * forward)
    assert op_seconds(Op("convolution_backward_input", 1000, 64, 576), profile) == \
        pytest.approx(forward)
    # a dtype (or a profile) without a convolution table: the GEMM of its FLOPs
    bf16 = op_seconds(Op("convolution", 1000, 64, 576, itemsize=2), profile)
    assert bf16 == pytest.approx(profile.matmul_s(1000, 64, 576, 2))
    assert bf16 < forward


def test_the_trace_names_a_convolutions_forward_and_the_gradients_its_backward_computes():
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)
    x = torch.randn(2, 8, 10, 10)
    # m = batch x output positions, n = output channels, k = input channels x kernel size
    shape = (2 * 10 * 10, 16, 8 * 9)
    for needs_grad, backward in ((False, "convolution_backward_weight"),
                                 (True, "convolution_backward_input_weight")):
        x.requires_grad_(needs_grad)
        ops = trace_callable(lambda: conv(x).sum().backward())
        convs = {op.kind: (op.m, op.n, op.k) for op in ops if op.kind.startswith("conv")}
        assert convs == {"convolution": shape, backward: shape}


def test_each_micro_step_pays_the_first_touch_of_its_transient_memory():
    ops = [Op("matmul", 256, 256, 256)]
    untouched = profiled_step(ops, 2, "adamw-default", 1, 1, synthetic(), transient_bytes=10**6)
    touched = profiled_step(ops, 2, "adamw-default", 1, 1,
                            synthetic(first_touch_s_per_byte=1e-9), transient_bytes=10**6)
    assert touched.seconds - untouched.seconds == pytest.approx(2 * 1e-3)
    assert "first touch 1 ms" in touched.how


def test_the_estimate_pays_first_touch_for_its_peak_phase():
    """The transient memory is the estimator's own peak phase (beyond the persistent
    state), a figure its memory half predicts to a few percent."""
    workload, env = load_workload("gpt", TINY_GPT), RuntimeEnv.detect("cpu")
    cold = estimate(gpt_plan(), workload, env, 1e11, profile=synthetic(first_touch_s_per_byte=1e-9))
    warm = estimate(gpt_plan(), workload, env, 1e11, profile=synthetic())
    transient = max(cold.phases.values())
    assert transient > 10**5  # a tiny GPT's activations and gradients: hundreds of kB
    assert cold.step_time_s - warm.step_time_s == pytest.approx(transient * 1e-9)


def test_a_cached_profile_of_an_older_schema_is_measured_again(tmp_path, monkeypatch):
    from training_harness.measure import cache, device_profile

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    cpu = torch.device("cpu")
    key = device_profile.cache_key(cpu)
    cache.add(device_profile.CACHE_FILE, {key: {**synthetic().data, "schema": 3}})
    assert device_profile.cached_profile(cpu) is None
    cache.add(device_profile.CACHE_FILE, {key: {**synthetic().data,
                                                "schema": device_profile.SCHEMA}})
    assert device_profile.cached_profile(cpu)["schema"] == device_profile.SCHEMA


def test_the_trace_reads_whether_attention_is_causal_and_defaults_to_full():
    q = torch.randn(1, 2, 16, 8, requires_grad=True)

    def kinds(**causal) -> set[tuple[str, bool]]:
        ops = trace_callable(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, q, q, **causal).sum().backward())
        return {(op.kind, op.causal) for op in ops if op.kind.startswith("attention")}

    # a ViT's attention leaves is_causal out: full, forward and backward
    assert kinds() == {("attention_forward", False), ("attention_backward", False)}
    assert kinds(is_causal=True) == {("attention_forward", True), ("attention_backward", True)}


def test_batch_norm_has_a_kind_of_its_own():
    from training_harness.estimator.op_trace import elementwise_kind

    # per channel over batch and positions: not the row-wise pass of a layer norm
    assert {elementwise_kind(n) for n in ("native_batch_norm", "native_batch_norm_backward",
                                          "_native_batch_norm_legit")} == {"batch_norm"}
    assert elementwise_kind("native_layer_norm") == "norm"
