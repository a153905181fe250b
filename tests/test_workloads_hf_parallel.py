"""hf:llama, hf:gpt2 and hf:bert under ddp, zero 1/2/3, tensor and pipeline parallel on
2 gloo ranks, tensor parallel by the harness's own plan on hf:bert, hf:opt and
hf:distilbert, and torchvision:resnet18 under ddp and zero 2/3, against the same model's
single-process fp32 run; and the refusals.

All cases (tests/workloads/run_hf_case.py: each case has its own layout of the two ranks)
run in one torchrun launch of 2 CPU ranks, on its own free port, under a timeout, with
tests/distributed/test_parallel_strategies.py's 2-rank cases (tests/conftest.py's
parallel_records: once per session). Every case trains 5 AdamW steps (lr 1e-2; resnet18
3 steps at 1e-3) on the same global batches of 8 as the single-process run (resnet18's accumulates
2 micro-batches of 4, the data ranks' share: BatchNorm normalises over each forward's
samples). The job's loss of a step: the mean
over data ranks, the last pipeline stage's, tensor rank 0's.

Tolerance: 1e-4 absolute on each step's loss (loss ≈ 4), as for the gpt's fp32 cases
in tests/distributed: only the summation order differs (observed ≤ 7.2e-7).
"""

from __future__ import annotations

import functools

import pytest
import torch.distributed as dist

from tests.distributed.run_case import HF, TIMEOUT_S
from tests.tiny import train
from tests.workloads.run_hf_case import CASES, STEPS, VISION_LR, VISION_STEPS
from tests.workloads.tiny_hf import TINY_HF, TINY_VISION, needs_transformers, tiny
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.strategies.compose import reasons_against

EXACT = 1e-4

pytestmark = pytest.mark.usefixtures("transformers_here")


@pytest.fixture(scope="module")
def transformers_here():
    needs_transformers()


@functools.cache
def baseline(key: str) -> tuple[float, ...]:
    if key in TINY_VISION:  # BatchNorm: the same 4-sample forwards as each data rank's
        return tuple(train({"accumulation": {}}, micro=4, global_batch=8, steps=VISION_STEPS,
                           lr=VISION_LR, workload=tiny(key)))
    return tuple(train({}, micro=8, global_batch=8, steps=STEPS, workload=tiny(key)))


def job_losses(records: dict[int, dict], layout: Layout, case: str) -> list[float]:
    picked = [records[r][case]["losses"] for r in range(layout.world_size)
              if layout.coordinates(r)[0] == layout.pipeline - 1
              and layout.coordinates(r)[2] == 0]
    return [sum(step) / len(step) for step in zip(*picked, strict=True)]


@pytest.mark.distributed
@pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed (gloo)")
@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_loss_matches_single_process(case, parallel_records):
    records = parallel_records(HF)
    if "skipped" in records[0][case.name]:
        pytest.skip(records[0][case.name]["skipped"])
    got = job_losses(records, Layout(**case.layout), case.name)
    want = baseline(case.model)
    diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
    assert max(diffs) <= EXACT, f"{case.name}: up to {max(diffs):.2e}\n{got}\n{want}"


def reasons(model_type: str, layout: dict, strategies: dict, **args) -> list[str]:
    plan = Plan(workload=f"hf:{model_type}", workload_args={**TINY_HF[model_type], **args},
                layout=Layout(**layout), global_batch_size=4,
                micro_batch_size=2 if "pipeline" in strategies else 4,  # 1f1b: 2 micro-batches
                strategies=strategies, device="cpu")
    return reasons_against(plan, RuntimeEnv.detect("cpu"))


def test_tensor_parallel_without_a_tp_plan_takes_the_harness_plan_or_says_why_not():
    (why,) = reasons("gpt2", {"tensor": 2}, {"tensor": {}})
    assert "transformers gives 'gpt2' no base_model_tp_plan, and the harness's own plan " \
           "cannot split it: its layers fuse q, k and v (or gate and up) in one Conv1D " \
           "(attn.c_attn)" in why
    for model_type in ("bert", "opt", "distilbert"):
        assert reasons(model_type, {"tensor": 2}, {"tensor": {}}) == []
    assert reasons("bert", {"tensor": 2}, {"tensor": {}}, num_attention_heads=1) == [
        "tensor parallel over 2 ranks needs num_attention_heads (1) divisible by 2: "
        "each rank computes whole heads"]
    (why,) = reasons("opt", {"tensor": 2}, {"tensor": {}}, ffn_dim=65)
    assert why.endswith("fc1 (out_features 65), fc2 (in_features 65); or mlp = false")
    assert reasons("opt", {"tensor": 2}, {"tensor": {"mlp": False}}, ffn_dim=65) == []


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_pipeline_is_refused_without_a_pp_plan(model_type):
    (why,) = reasons(model_type, {"pipeline": 2}, {"pipeline": {}})
    assert "no base_model_pp_plan, so its forward cannot be cut" in why


def test_llama_refusals_name_what_to_change():
    why = reasons("llama", {"tensor": 2}, {"tensor": {}}, num_key_value_heads=1)
    assert why == ["tensor parallel over 2 ranks needs num_key_value_heads (1) divisible by 2: "
                   "each rank computes whole heads"]
    why = reasons("llama", {"pipeline": 2}, {"pipeline": {}}, tie_word_embeddings=True,
                  num_hidden_layers=3)
    assert any("3 decoder layers do not split evenly into 2 stages" in w for w in why)
    assert any("set tie_word_embeddings = false" in w for w in why)
    assert reasons("llama", {"tensor": 2}, {"tensor": {}}) == []
    assert reasons("llama", {"pipeline": 2}, {"pipeline": {}}) == []
