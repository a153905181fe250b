"""Planning for GPUs this machine does not have: the datasheet table, `harness estimate
--target`, `harness plan`, and the estimator's per-workload caches that make it fast."""

from __future__ import annotations

import json

import pytest

from tests.estimator.models import CPU, TinyClassifier
from training_harness.cli.main import main
from training_harness.cli.plan import TargetPredictor
from training_harness.core.errors import HarnessError
from training_harness.core.gpus import (
    GPUS,
    MEASURED_CONTEXT_BYTES,
    MEASURED_WORKSPACE_BYTES,
    gpu_named,
    targets,
)
from training_harness.core.plan import Plan
from training_harness.estimator import estimate, trace
from training_harness.estimator.bandwidth import bandwidth
from training_harness.estimator.target import Target
from training_harness.measure.peaks import datasheet_peak

TINY = {"name": "gpt", "layers": 2, "heads": 4, "hidden": 64, "seq_len": 64, "vocab": 512}
WANTED = {"h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "a100-sxm-40gb",
          "a100-sxm-80gb", "l40s-48gb", "a10g-24gb", "rtx4090-24gb", "mi300x-192gb"}


def test_every_target_has_its_whole_sheet_and_names_its_own_row():
    assert set(targets()) >= WANTED
    for name, gpu in targets().items():
        assert gpu.memory_bytes and gpu.memory_bandwidth and gpu.link and gpu.torch_name, name
        assert {"fp32", "bf16", "fp16"} <= set(gpu.flops), name
        # the name torch gives it finds the same row: peaks and bandwidths agree with it
        assert gpu_named(gpu.torch_name) is gpu, name
        assert datasheet_peak(gpu.torch_name, "bf16").flops == gpu.flops["bf16"]
        assert bandwidth("cuda", gpu.torch_name).memory == gpu.memory_bandwidth
        assert gpu.flops.get("fp8", 2 * gpu.flops["bf16"]) == pytest.approx(2 * gpu.flops["bf16"],
                                                                   rel=0.03)
    assert len({g.target for g in GPUS if g.target}) == len(targets())  # one row per name


def test_an_unknown_target_lists_the_known_ones(tmp_path, capsys):
    with pytest.raises(HarnessError, match="h100-sxm-80gb"):
        Target.named("h100")
    study = tmp_path / "s.toml"
    study.write_text(_study())
    assert main(["plan", str(study), "--target", "v100-16gb"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a100-sxm-80gb" in err
    assert main(["estimate", "--workload", "gpt", "--target", "nope"]) == 2


def _plan(**kw) -> Plan:
    data = {"workload": TINY, "micro_batch_size": 4, "global_batch_size": 8,
            "layout": {"data": 2}, "strategies": {"ddp": {}, "amp": {"dtype": "bf16"}}}
    return Plan.from_dict({**data, **kw}, where="test")


def test_a_target_estimate_uses_its_sheet_and_the_measured_context():
    h100 = TargetPredictor(Target.named("h100-sxm-80gb", 2)).prepare(_plan()).predicted
    a100 = TargetPredictor(Target.named("a100-sxm-80gb", 2)).prepare(_plan()).predicted
    assert h100["target"] == {"name": "h100-sxm-80gb", "gpus": 2, "dtype": "bf16",
                              "tokens_per_sample": 64}
    # the context and workspaces measured on the project's H100 (0.51 + 0.24 GiB)
    assert h100["memory"]["device_context"] == MEASURED_CONTEXT_BYTES + MEASURED_WORKSPACE_BYTES
    # the same tensors; the slower GPU (peak, HBM, NVLink) takes longer per step
    assert a100["peak_memory_bytes"] == h100["peak_memory_bytes"]
    assert a100["step_time_s"] > h100["step_time_s"]
    # more GPUs than the target has: refused, saying so
    with pytest.raises(HarnessError, match="needs 2 GPUs"):
        TargetPredictor(Target.named("h100-sxm-80gb", 1)).prepare(_plan())


def test_estimate_target_widens_the_data_axis_to_the_gpus(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text("micro_batch_size = 4\nglobal_batch_size = 32\nlayout = { data = 2 }\n"
                    "[workload]\n" + "".join(f"{k} = {v!r}\n" for k, v in TINY.items())
                    + "[strategies.ddp]\n[strategies.amp]\ndtype = 'bf16'\n")
    assert main(["estimate", str(path), "--target", "h100-sxm-80gb", "--gpus", "8",
                 "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["sharding"]["data_ranks"] == 8 and predicted["target"]["gpus"] == 8
    assert main(["estimate", str(path), "--target", "a100-sxm-40gb", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "fits:" in out and "nothing was run" in out
    assert main(["estimate", str(path), "--target", "h100-sxm-80gb", "--gpus", "3"]) == 2


def _study(budget: str = "0.9") -> str:
    return f"""
name = "tiny-8gpu"
device = "cuda"
global_batch_size = 32
micro_batch_sizes = [1, 2, 4]
[workload]
name = "gpt"
layers = 2
heads = 4
hidden = 64
seq_len = 64
vocab = 512
[layout]
world_sizes = [4]
tensor = [1, 2]
[budget]
memory = {budget}
[strategies.amp]
values = {{ dtype = ["bf16"] }}
[strategies.checkpoint]
search = []
[strategies.ddp]
search = []
[strategies.zero]
search = ["stage"]
[strategies.tensor]
search = []
"""


def test_plan_ranks_the_space_as_the_search_rates_it(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(_study())
    assert main(["plan", str(path), "--target", "h100-sxm-80gb", "--gpus", "8", "--top", "4",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4 and all(r["fits"] for r in rows)
    rates = [r["samples_per_s"] for r in rows]
    assert rates == sorted(rates, reverse=True)
    # --gpus 8 replaced the study's world size of 4
    assert all(Plan.from_dict(r["plan"]).world_size == 8 for r in rows)
    # each row's rate is the global batch over the estimate of its plan on the target
    best = Plan.from_dict(rows[0]["plan"])
    again = TargetPredictor(Target.named("h100-sxm-80gb", 8)).prepare(best).predicted
    assert rates[0] == pytest.approx(best.batch_size / again["step_time_s"])

    assert main(["plan", str(path), "--target", "a10g-24gb", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "PREDICTED, NOT MEASURED" in out and "4 x NVIDIA A10G" in out
    assert "ranked all " in out and out.count(" yes  d") == 3


def test_plan_says_when_nothing_fits(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(_study())
    assert main(["plan", str(path), "--target", "l40s-48gb", "--memory-budget", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "none is predicted to fit" in out and " 0 predicted to fit" in out
    assert main(["plan", "--list-targets"]) == 0
    assert "mi300x-192gb" in capsys.readouterr().out


def test_a_workload_is_traced_once_per_micro_batch_whatever_is_checkpointed(monkeypatch):
    calls = []
    run = trace._run_forward
    monkeypatch.setattr(trace, "_run_forward", lambda *a: calls.append(a[1:]) or run(*a))
    w = TinyClassifier(attention="sdpa")
    plans = [Plan(workload="custom", micro_batch_size=3, strategies=s)
             for s in ({}, {"checkpoint": {"every": 1}}, {"checkpoint": {"every": 2}}, {})]
    first, every1, every2, again = (estimate(p, w, CPU) for p in plans)
    assert len(calls) == 1  # one forward pass; checkpointing changes only what is counted
    assert again.to_record() == first.to_record()
    assert every1.memory["activations"] < every2.memory["activations"] < first.memory[
        "activations"]
    estimate(Plan(workload="custom", micro_batch_size=2), w, CPU)
    assert len(calls) == 2
    # a new workload object is traced afresh, and gives the same figures
    assert estimate(plans[1], TinyClassifier(attention="sdpa"), CPU).to_record() == (
        every1.to_record())
