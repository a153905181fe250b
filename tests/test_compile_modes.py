"""Compile at its real cost: the compile modes (only "default" off CUDA, the others
refused with the reason), compile time in the record, each study's inductor cache."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.measure.compile_cost import compile_seconds, compiles, inductor_cache_env
from training_harness.strategies import fused, registry
from training_harness.strategies.fused import FusedSettings

CPU = RuntimeEnv.detect("cpu")
H100 = replace(CPU, device_type="cuda", device_name="NVIDIA H100", triton=True)
MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")


def reasons(mode, env, **strats):
    plan = Plan(device=env.device_type, strategies={
        "fused": {"compile": True, "compile_mode": mode}, **strats},
        layout=Layout(pipeline=2) if "pipeline" in strats else Layout())
    return registry.get("fused").check(FusedSettings(compile=True, compile_mode=mode),
                                         plan, env)


def test_modes_are_searchable():
    assert registry.get("fused").space()["compile_mode"].values == MODES


def test_off_cuda_only_default_with_the_reason(monkeypatch):
    monkeypatch.setattr("training_harness.strategies.fused.has_compiler", lambda: True)
    assert reasons("default", CPU) == []
    (autotune,) = reasons("max-autotune-no-cudagraphs", CPU)
    assert "is for CUDA (Triton kernel autotuning)" in autotune and "'default'" in autotune
    (graphs,) = reasons("reduce-overhead", CPU)
    assert "CUDA graphs" in graphs
    (both,) = reasons("max-autotune", CPU)
    assert "Triton kernel autotuning and CUDA graphs" in both
    # refused with compile off too, so that a CPU study's search never offers them
    off = FusedSettings(compile=False, compile_mode="reduce-overhead")
    assert registry.get("fused").check(off, Plan(device="cpu"), CPU)


def test_on_cuda_and_where_cuda_graphs_cannot_replay():
    for mode in MODES:
        assert reasons(mode, H100) == [], mode
    (fsdp,) = reasons("reduce-overhead", H100, zero={})  # stage 2 by default
    assert "FSDP" in fsdp and "max-autotune-no-cudagraphs" in fsdp
    assert reasons("reduce-overhead", H100, zero={"stage": 1}) == []
    assert reasons("max-autotune-no-cudagraphs", H100, zero={"stage": 3}) == []
    assert any("pipeline" in r for r in reasons("reduce-overhead", H100, pipeline={}))
    (fsdp,) = reasons("max-autotune", H100, zero={"stage": 3})  # CUDA graphs too
    assert "'max-autotune' (CUDA graphs)" in fsdp
    assert any("pipeline" in r for r in reasons("max-autotune", H100, pipeline={}))


def test_compile_seconds_and_what_compiles():
    assert compile_seconds([5.0, 1.2, 0.1, 0.1, 0.1], 0.1) == pytest.approx(6.0)
    assert compile_seconds([], 0.1) is None and compile_seconds([1.0], None) is None
    assert compiles({"fused": {"compile": True}})
    assert compiles({"fused": {"layernorm": "compile"}})
    assert not compiles({"fused": {}}) and not compiles({"amp": {}})


def test_each_study_has_its_own_inductor_cache(tmp_path):
    trial = tmp_path / "runs" / "s1" / "trials" / "7"
    assert inductor_cache_env(trial, "s1", {}) == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "runs" / "s1" / "inductor_cache")}
    assert inductor_cache_env(trial, None, {}) == {}  # a lone bench: torch's default
    assert inductor_cache_env(trial, "s1", {"TORCHINDUCTOR_CACHE_DIR": "/mine"}) == {}
    assert inductor_cache_env(tmp_path / "bench", "s1", {}) == {}


@pytest.mark.slow
def test_compile_time_is_in_the_record_of_a_compiled_trial():
    """One tiny compiled CPU trial (slow: inductor compiles on the CPU). Its model, batch
    and settings are test_strategies.py's compiled run's, so that whichever runs second
    finds the kernels in inductor's cache."""
    from tests.test_measurement_window import PEAK
    from tests.tiny import TINY_GPT
    from training_harness.measure.prepare import prepare
    from training_harness.measure.trial_loop import measure

    if not fused.has_compiler():
        pytest.skip("no C compiler for inductor on the CPU")
    plan = Plan(name="compiled", workload="gpt", workload_args=TINY_GPT, device="cpu",
                micro_batch_size=8, global_batch_size=8, warmup_steps=2, steps=2,
                strategies={"fused": {"compile": True, "attention": "sdpa"}})
    metrics, status, reason = measure(prepare(plan, peaks={"fp32": PEAK}))
    assert (status, reason) == ("ok", None)
    assert metrics["compile_s"] is not None and metrics["compile_s"] > 0
    # the first warm-up step compiled: most of the warm-up's time
    assert metrics["compile_s"] <= metrics["phases_s"]["warmup"]
