"""Under [strategies.lora] only the adapters train: the estimate's gradients and optimizer
state are the adapters' bytes, counted against a real peft-wrapped model's trainable
parameters (peft's own count, not the estimator's), and its parameters hold the frozen
base and the adapters both."""

from __future__ import annotations

import pytest

from tests.estimator.models import CPU
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.estimator import estimate
from training_harness.workloads import load_workload

LLAMA = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=64, seq_len=16)
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def peft():
    try:
        from training_harness.strategies.lora import peft_module

        return peft_module()
    except HarnessError as e:
        pytest.skip(str(e))


def peft_counts(peft, workload, rank: int, targets: list[str]) -> tuple[int, int]:
    """(trainable, all) parameters of the workload's model wrapped by peft.get_peft_model."""
    model = workload.build_model()
    config = peft.LoraConfig(r=rank, lora_alpha=16, target_modules=targets)
    return peft.get_peft_model(model, config).get_nb_trainable_parameters()


@pytest.mark.parametrize(("rank", "targets"), [(8, []), (4, ALL_LINEARS)])
def test_lora_gradients_and_moments_are_the_adapters(peft, rank, targets):
    workload = load_workload("hf:llama", LLAMA)
    plan = Plan(workload="hf:llama", workload_args=LLAMA, device="cpu", micro_batch_size=2,
                global_batch_size=2,
                strategies={"lora": {"rank": rank, "target_modules": targets}})
    # peft's default for llama is q_proj and v_proj
    trainable, total = peft_counts(peft, workload, rank, targets or ["q_proj", "v_proj"])
    h, f, kv = 32, 64, 32  # hidden, FFN, key/value width (2 heads of 16)
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    adapted = targets or ["q_proj", "v_proj"]
    assert trainable == 2 * sum(rank * sum(shapes[t]) for t in adapted)  # rank x (in + out)

    e = estimate(plan, workload, CPU)
    assert e.memory["gradients"] == 4 * trainable
    assert e.memory["optimizer_state"] == 8 * trainable  # AdamW's two moments
    assert e.memory["parameters"] == 4 * total  # the frozen base and the adapters
    full = estimate(plan.replace(strategies={}), workload, CPU)
    assert full.memory["gradients"] == 4 * (total - trainable)  # every base weight trains
    assert any(f"{trainable:,} trainable ones (LoRA's adapters)" in a for a in e.assumptions)


def test_lora_under_zero1_partitions_the_adapters_only(peft):
    workload = load_workload("hf:llama", LLAMA)
    plan = Plan(workload="hf:llama", workload_args=LLAMA, device="cpu", micro_batch_size=2,
                global_batch_size=4, layout=Layout(data=2),
                strategies={"lora": {}, "zero": {"stage": 1}})
    trainable, _ = peft_counts(peft, workload, 8, ["q_proj", "v_proj"])
    e = estimate(plan, workload, CPU)
    assert e.memory["gradients"] == 4 * trainable
    # eight adapter tensors of 256 elements: four on each rank
    assert e.memory["optimizer_state"] == 8 * trainable // 2
