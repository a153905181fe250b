"""The simulated H100 surfaces (tests/benchmarks/surfaces/h100.py) and the replay that drives
the real Tuner against them (tests/benchmarks/surface_replay)."""

from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path

import pytest
import tomli_w

from tests.benchmarks.surfaces.h100 import gpt2_small_1gpu, gpt_1b_8gpu
from tests.benchmarks.surfaces.hardware import CAPACITY

ROOT = Path(__file__).resolve().parents[2]
GPT2 = {"name": "gpt", "layers": 12, "heads": 12, "hidden": 768, "seq_len": 1024, "vocab": 50304}
GPT1B = {"name": "gpt", "layers": 24, "heads": 16, "hidden": 2048, "seq_len": 2048,
         "vocab": 50304, "tie_weights": False}


def plan(micro: int, strategies: dict, workload: dict = GPT2, batch: int = 64, **layout) -> dict:
    lay = {"data": 1, "pipeline": 1, "tensor": 1, **layout}
    steps = batch // (micro * lay["data"])
    extra = {"accumulation": {}} if steps > 1 and lay["pipeline"] == 1 else {}
    return {"name": "t", "workload": workload, "device": "cuda", "layout": lay,
            "micro_batch_size": micro, "global_batch_size": batch,
            "strategies": {**strategies, **extra}, "warmup_steps": 5, "steps": 20,
            "timeout_s": 1200.0}


BF16_SDPA = {"amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa", "optimizer": "fused"}}


def test_deterministic_per_plan_and_repeat():
    p = plan(16, BF16_SDPA)
    assert gpt2_small_1gpu(p, 0) == gpt2_small_1gpu(p, 0)
    assert gpt2_small_1gpu(p, 0)["samples_per_s"] != gpt2_small_1gpu(p, 1)["samples_per_s"]
    # the same configuration spelt with its defaults written out draws the same noise
    full = plan(16, {"amp": {"dtype": "bf16", "init_scale": 65536.0},
                     "fused": {"attention": "sdpa", "optimizer": "fused", "compile": False,
                               "layernorm": "eager", "gelu": "eager",
                               "cross_entropy": "eager"}}) | {"name": "other", "seed": 7}
    assert gpt2_small_1gpu(full, 3) == gpt2_small_1gpu(p, 3)
    # within the stated +-4% of the noise-free figure
    truth = gpt2_small_1gpu.truth(p)["samples_per_s"]
    for repeat in range(20):
        assert abs(gpt2_small_1gpu(p, repeat)["samples_per_s"] / truth - 1) <= 0.04 + 1e-9
    q = plan(4, {"amp": {"dtype": "bf16"}, "zero": {"stage": 3}}, workload=GPT1B, batch=256,
             data=8)
    assert gpt_1b_8gpu(q, 2) == gpt_1b_8gpu(q, 2)


def test_over_80_gb_is_oom():
    fp32 = plan(64, {})  # eager attention and fp32 logits at 64 x 1024 tokens
    out = gpt2_small_1gpu(fp32, 0)
    assert out["status"] == "oom" and out["samples_per_s"] == 0
    assert out["peak_memory_bytes"] == CAPACITY and out["wall_s"] > 0
    ddp = plan(16, {"ddp": {}}, workload=GPT1B, batch=256, data=8)  # fp32, eager attention
    assert gpt_1b_8gpu(ddp, 0)["status"] == "oom"
    fits = gpt2_small_1gpu(plan(8, BF16_SDPA), 0)
    assert fits["status"] == "ok" and fits["peak_memory_bytes"] < CAPACITY


def test_larger_micro_batch_is_faster_until_memory_runs_out():
    for strategies in (BF16_SDPA, {"amp": {"dtype": "bf16"}}, {}):
        rates, statuses = [], []
        for micro in (1, 2, 4, 8, 16, 32, 64):
            t = gpt2_small_1gpu.truth(plan(micro, strategies))
            statuses.append(t["status"])
            if t["status"] == "ok":
                rates.append(t["samples_per_s"])
        assert rates == sorted(rates) and len(set(rates)) == len(rates), strategies
        first_oom = statuses.index("oom") if "oom" in statuses else len(statuses)
        assert all(s == "ok" for s in statuses[:first_oom])
        assert all(s == "oom" for s in statuses[first_oom:])
    assert "oom" in statuses  # fp32 runs out before micro-batch 64
    assert gpt2_small_1gpu.truth(plan(1, BF16_SDPA))["samples_per_s"] < 0.5 * \
        gpt2_small_1gpu.truth(plan(64, BF16_SDPA))["samples_per_s"]  # launch-bound


@contextlib.contextmanager
def small_cut(tmp_path):
    """A 120-configuration cut of the 1-GPU space, checked, with its truth: (setup, space)."""
    from tests.benchmarks.surface_replay.harness_run import prepare_study
    from tests.benchmarks.surface_replay.others import enumerate_space
    from tests.benchmarks.surface_replay.world import h100_world

    table = tomllib.loads((ROOT / "studies" / "gpt2-small-1gpu.toml").read_text())
    table["name"] = "surface-cut"
    table["micro_batch_sizes"] = {"min": 8, "max": 64}
    table["budget"]["time"] = "3h"
    table["strategies"] = {"amp": {"values": {"dtype": ["bf16"]}},
                           "fused": {"search": ["attention", "compile"],
                                     "values": {"attention": ["explicit", "sdpa"]}},
                           "checkpoint": {"values": {"every": [1]}}}
    study = tmp_path / "cut.toml"
    study.write_text(tomli_w.dumps(table))
    with h100_world(1):
        setup = prepare_study(study, gpt2_small_1gpu, tmp_path)
        space = enumerate_space(setup.checked.space, gpt2_small_1gpu.truth,
                                setup.checked.budget_bytes)
        setup.size, setup.best, setup.goal = len(space.plans), space.best, 0.97 * space.best
        yield setup, space


def test_a_small_cut_replays_through_the_real_tuner(tmp_path):
    from tests.benchmarks.surface_replay.harness_run import run_seed
    from tests.benchmarks.surface_replay.others import run_random

    with small_cut(tmp_path) as (setup, space):
        assert setup.size == 4 * 2 * 5 * 3  # checkpointing: off, full or selective
        runs = [run_seed(setup, seed) for seed in range(2)]
        assert run_random(setup, space, 0).reached_s is not None
    for run in runs:
        assert run.launched >= 3 and run.stopped
        assert run.named is not None and not run.named["over_measured"]
        assert run.curve[-1][1] > 0 and run.curve == sorted(run.curve)
    import training_harness.launch.torch_helper as torch_helper
    from training_harness.core.device import RuntimeEnv

    assert torch_helper.shared.__module__ == "training_harness.launch.torch_helper"  # restored
    assert RuntimeEnv.detect("cpu").device_type == "cpu"


def test_an_optuna_sampler_searches_in_the_harness_s_place(tmp_path):
    """Only the sampler swapped: the references first, then every trial the sampler's
    (no estimator's first guesses queued), through the same Tuner; the product restored."""
    import optuna

    import training_harness.tune.session as session
    from tests.benchmarks.surface_replay.harness_run import run_seed

    asked: set[int] = set()

    class Counting(optuna.samplers.TPESampler):
        def sample_independent(self, study, trial, name, distribution):
            asked.add(trial.number)
            return super().sample_independent(study, trial, name, distribution)

    made, guesses = session.make_sampler, session.estimated_start
    with small_cut(tmp_path) as (setup, _):
        run = run_seed(setup, 0, sampler=Counting(seed=0))
        references = len(setup.checked.references)
        setup.goal = float("inf")  # never reached: the run is censored at its horizon
        cut = run_seed(setup, 0, sampler=optuna.samplers.TPESampler(seed=0), horizon_s=900)
    assert run.launched > references and run.stopped and asked
    assert min(asked) == references  # the first trial after the references is the sampler's
    assert run.curve[-1][1] > 0 and run.named is not None
    assert (session.make_sampler, session.estimated_start) == (made, guesses)
    assert cut.reached_s is None and cut.censored_s == 900 and 900 <= cut.elapsed_s < 1800
    assert cut.stopped == "replay: censored at 0.25 h"


def test_the_measured_h200_table_replays_through_the_real_tuner():
    """The H200 table as a surface (table_run.py): every recorded configuration found
    under the key today's plans give it, only the ones the table lacks answered as not
    measured, and the harness's real search (the GuidedSampler over the estimator, on an
    H200 world) reaching 0.97 of the table's best, as `harness tune` would search it."""
    import tests.benchmarks.surface_replay.table_run as table_run

    folder = ROOT / "tests" / "benchmarks" / "tables" / "gpt2-small-1gpu-table80_h200"
    surface = table_run.TableSurface(folder)
    assert len(surface.rows) == 48 and surface.best > 450
    asked: list[dict] = []

    class Watched(table_run.TableSurface):
        def __call__(self, plan: dict, repeat: int = 0) -> dict:
            out = super().__call__(plan, repeat)
            asked.append(out)
            return out

    with contextlib.ExitStack() as stack:
        stack.callback(setattr, table_run, "TableSurface", table_run.TableSurface)
        table_run.TableSurface = Watched
        result = table_run.run(folder, seeds=1)
    (run,) = result["runs"]["harness"]
    assert result["configurations"] == 80 and run["reached_s"] is not None
    measured = [a for a in asked if a.get("reason") != "not measured in the table"]
    assert len(measured) >= 3 and all(a["status"] in ("ok", "oom") for a in measured)
    assert len(asked) - len(measured) <= 80 - 48


def test_the_gemm_oracle_rebuilds_the_estimator_s_step_and_scales_only_its_compute():
    """search_replay.py --oracle-gemm changes a prediction after the estimator: at the
    estimator's own MFU it gives back the estimator's step to the last bit, and at half
    that efficiency it gives the step the estimator itself makes of twice the compute (a
    pipeline's bubble and a launch-bound step included)."""
    import dataclasses

    from tests.benchmarks.surface_replay.world import gemm_oracle
    from tests.benchmarks.surfaces.assumptions import BASE
    from training_harness.estimator.bandwidth import bandwidth
    from training_harness.estimator.step_costs import COMPUTE_MFU, StepCosts, cuda_step_time

    plan = {"workload": {"name": "gpt", "layers": 12, "hidden": 768, "seq_len": 1024},
            "micro_batch_size": 8, "global_batch_size": 64, "strategies": {"amp": {}}}
    bw = bandwidth("cuda", "NVIDIA H100 80GB HBM3")
    at_mfu = dataclasses.replace(BASE, gemm_top16=COMPUTE_MFU, gemm_width16=0.0,
                                 gemm_tokens16=0.0)
    at_half = dataclasses.replace(at_mfu, gemm_top16=COMPUTE_MFU / 2)
    for compute_s, bubble, microsteps in ((0.1, 0.0, 8), (0.1, 0.25, 8), (1e-4, 0.0, 64)):
        costs = StepCosts(microsteps=microsteps, blocks=12, compiled=False, data=1, zero=0,
                          model_bytes=10**8, state_touched_bytes=10**9,
                          gradient_bytes=10**8, param_tensors=150, optimizer_impl="fused",
                          tensor=1, activation_bytes=10**7)
        step, _, parts = cuda_step_time(compute_s, costs, bw, bubble, 0.3)
        predicted = {"step_time_s": step, "step_parts": parts}
        assert gemm_oracle(at_mfu)(plan, predicted)["step_time_s"] == pytest.approx(
            step, rel=1e-12)
        twice, _, twice_parts = cuda_step_time(2 * compute_s, costs, bw, bubble, 0.3)
        got = gemm_oracle(at_half)(plan, predicted)
        assert got["step_time_s"] == pytest.approx(twice, rel=1e-12)
        assert got["step_parts"] == pytest.approx(twice_parts, rel=1e-12)
