"""On a GPU: the CUDA paths a CPU never runs, each against the fp32 baseline on CUDA.

Tolerances, as tests/test_strategies.py, on the loss after each of 5 AdamW steps at
lr 1e-2 (loss ≈ 4) of the tiny GPT: bf16 and fp16 autocast 2e-2 (8 and 11 mantissa
bits; the fp16 scaler's loss scale cancels exactly when no step overflows).
A whole trial through `harness bench` on CUDA checks the record: MFU below 1
against both peaks, the device's held memory at least the allocator's reserved
pool, the NVML reading present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny import tiny_gpt, train
from training_harness.strategies.compose import compose

ROOT = Path(__file__).resolve().parents[1]
AMP = 2e-2

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def baseline_cuda() -> list[float]:
    return train({}, device="cuda")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_amp_on_cuda_matches_fp32(baseline_cuda, dtype):
    losses = train({"amp": {"dtype": dtype}}, device="cuda")
    diffs = [abs(a - b) for a, b in zip(losses, baseline_cuda, strict=True)]
    assert max(diffs) <= AMP, diffs


def test_fp16_scaler_scales_and_steps():
    """The GradScaler is there, its scale is finite, and the optimizer really steps
    (a scaler that skipped every step would leave the weights where they were)."""
    workload = tiny_gpt()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = workload.build_model()
    setup = compose(model, {"amp": {"dtype": "fp16"}}, "cuda")
    assert setup.grad_scaler is not None
    before = [p.detach().clone() for p in setup.model.parameters()]
    for s in range(3):
        setup.step([workload.batch(8, s, "cuda")], workload.loss)
    scale = setup.grad_scaler.get_scale()
    assert 0 < scale <= 2.0**16 and scale == scale
    moved = [not torch.equal(a, b) for a, b in zip(before, setup.model.parameters(), strict=True)]
    assert all(moved)


def _bench(tmp_path: Path, plan: str, *extra: str) -> dict:
    out = tmp_path / Path(plan).stem
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "training_harness", "bench", plan, "--device",
                           "cuda",
                           "--out", str(out), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.slow
def test_a_cuda_trial_records_honest_figures(tmp_path):
    record = _bench(tmp_path, "studies/plans/amp-bf16.toml")
    m = record["metrics"]
    assert record["status"] == "ok", record["reason"]
    assert 0 < m["mfu"] < 1 and 0 < m["mfu_measured_peak"] < 1
    assert m["peak_flops"]["dtype"] == "bf16"
    memory = m["memory"]
    assert memory["allocated"] <= memory["reserved"] <= memory["device_held"]
    assert m["peak_memory_bytes"] == memory["device_held"]
    assert m["nvml"] is not None and m["nvml"]["samples"] >= 1


@pytest.mark.slow
def test_fp32_resnet_mfu_is_against_the_tf32_peak(tmp_path):
    """cuDNN runs fp32 convolutions on TF32 tensor cores by default."""
    record = _bench(tmp_path, "studies/plans/resnet.toml")
    assert record["status"] == "ok", record["reason"]
    peak = record["metrics"]["peak_flops"]
    assert peak["dtype"] == ("tf32" if torch.backends.cudnn.allow_tf32 else "fp32"), peak
    assert record["metrics"]["mfu"] < 1


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("plan", ["ddp", "zero3"])
def test_ddp_and_fsdp2_over_nccl(tmp_path, plan):
    record = _bench(tmp_path, f"studies/plans/{plan}.toml")
    assert record["status"] == "ok", record["reason"]
    assert len(record["metrics"]["per_rank"]) == 2
    assert record["env"]["nccl"]


def test_two_ranks_on_one_gpu_are_refused_before_anything_starts(tmp_path):
    if torch.cuda.device_count() != 1:
        pytest.skip("for a one-GPU machine")
    out = tmp_path / "never"
    done = subprocess.run([sys.executable, "-m", "training_harness", "bench",
                           "studies/plans/ddp.toml",
                           "--device", "cuda", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "need 2 GPU(s) per node" in done.stderr
    assert not out.exists()
