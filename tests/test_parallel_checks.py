"""The parallel strategies' checks: a plan that cannot run is refused in words, before launch.

No process group here: these only read the plan (and the machine's kind).
"""

from __future__ import annotations

import pytest
import torch

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.strategies.compose import reasons_against
from training_harness.strategies.tensor import interleave_qkv

CPU = RuntimeEnv("cpu", "cpu", 1, bf16=True, triton=False)
GPT = dict(layers=4, heads=4, hidden=64, seq_len=16, vocab=64, tie_weights=False)


def plan(strategies, micro=2, global_batch=None, gpt=None, **layout) -> Plan:
    return Plan(workload_args={**GPT, **(gpt or {})}, layout=Layout(**layout),
                micro_batch_size=micro, global_batch_size=global_batch, strategies=strategies)


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (plan({"ddp": {}, "zero": {}}, data=2), "ddp and zero are mutually exclusive"),
        (plan({"ddp": {}}), "layout data = 1; set [layout] data = 2"),
        (plan({"zero": {"stage": 2, "offload": True}}, data=2), "stage 3 only, not stage 2"),
        (plan({"ddp": {"compression": "bf16"}}, data=2), "'bf16' needs CUDA with NCCL"),
        (plan({"ddp": {}, "tensor": {}}, data=2, tensor=2), "does not take tensor-parallel"),
        (plan({"zero": {"stage": 1}, "tensor": {}}, data=2, tensor=2), "use zero with stage = 2"),
        (plan({}, data=2), "neither ddp nor zero splits the batch"),
        (plan({"ddp": {}, "pipeline": {}}, global_batch=8, data=2, pipeline=2),
         "use zero with stage = 2 or 3 beside pipeline"),
        (plan({"zero": {"stage": 1}, "pipeline": {}}, global_batch=8, data=2, pipeline=2),
         "use zero with stage = 2 or 3 beside pipeline"),
        (plan({"ddp": {}}, data=2, pipeline=2), "no [strategies.pipeline]"),
        (plan({"ddp": {}}, data=2, tensor=2), "no [strategies.tensor]"),
        (plan({"pipeline": {}}, global_batch=4, gpt={"tie_weights": True}, pipeline=2),
         "set tie_weights = false"),
        (plan({"pipeline": {}}, global_batch=4, gpt={"layers": 3}, pipeline=2),
         "3 layers do not split evenly into 2 stages"),
        (plan({"pipeline": {"stages": 4}}, global_batch=4, pipeline=2), "set stages = 2"),
        (plan({"pipeline": {"microbatches": 4}}, global_batch=4, pipeline=2),
         "set global_batch_size = 8"),
        (plan({"pipeline": {"schedule": "1f1b"}}, global_batch=2, pipeline=2),
         "at least as many micro-batches as stages"),
        (plan({"pipeline": {"schedule": "interleaved-1f1b"}}, global_batch=4, pipeline=2),
         "needs virtual_stages = 2 or more"),
        (plan({"pipeline": {"schedule": "gpipe", "virtual_stages": 2}}, global_batch=4,
              pipeline=2), "runs one stage per rank"),
        (plan({"pipeline": {"schedule": "interleaved-1f1b", "virtual_stages": 2}},
              global_batch=10, pipeline=2), "multiple of the rounds"),
        (plan({"pipeline": {}, "amp": {"dtype": "fp16"}}, global_batch=4, pipeline=2),
         "use amp dtype = 'bf16'"),
        (plan({"pipeline": {}}), "needs layout pipeline = 2 or more"),
        (plan({"tensor": {}}, gpt={"heads": 3, "hidden": 48}, tensor=2),
         "heads (3) divisible by 2"),
        (plan({"tensor": {}}), "needs layout tensor = 2 or more"),
    ],
)
def test_refused_with_the_reason(p, expected):
    reasons = reasons_against(p, CPU)
    assert any(expected in r for r in reasons), reasons


@pytest.mark.parametrize(
    "p",
    [
        plan({"ddp": {"compression": "fp16"}}, data=2),
        plan({"zero": {"stage": 1}}, data=2),
        plan({"zero": {"stage": 3, "offload": True}, "amp": {}}, data=2),
        # The pipeline runs the plan's micro-batches itself: no [strategies.accumulation].
        plan({"pipeline": {"schedule": "1f1b"}}, global_batch=8, pipeline=2),
        plan({"pipeline": {"schedule": "interleaved-1f1b", "virtual_stages": 2}},
             global_batch=8, pipeline=2),
        plan({"tensor": {}}, tensor=2),
        plan({"pipeline": {}, "zero": {"stage": 2}, "tensor": {}}, global_batch=16,
             pipeline=2, data=2, tensor=2),
    ],
)
def test_accepted(p):
    assert reasons_against(p, CPU) == []


def test_interleaved_qkv_gives_each_rank_its_own_q_k_and_v():
    hidden, ranks = 8, 2
    qkv = torch.nn.Linear(hidden, 3 * hidden)
    rows = torch.arange(3 * hidden, dtype=torch.float32)
    with torch.no_grad():
        qkv.weight.copy_(rows[:, None].expand(-1, hidden))
        qkv.bias.copy_(rows)
    interleave_qkv(qkv, ranks)
    half = hidden // ranks
    for r, shard in enumerate(qkv.bias.detach().chunk(ranks)):
        q, k, v = shard.chunk(3)
        for part, start in zip((q, k, v), (0, hidden, 2 * hidden), strict=True):
            assert part.tolist() == list(range(start + r * half, start + (r + 1) * half))
    assert torch.equal(qkv.weight[:, 0], qkv.bias)
