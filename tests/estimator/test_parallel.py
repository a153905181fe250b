"""The estimator's distributed modelling: ZeRO's state per stage, DDP's buckets, FSDP's
gathered parameters, the pipeline's bubble, micro-batches in flight and stages, tensor
parallel's split of weights and activations."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from torch import nn

from tests.estimator.models import CPU, CUDA, MLP, SHAPE
from training_harness.core.plan import Layout, Plan
from training_harness.estimator import (
    PAPER,
    Parallelism,
    block_activation_terms,
    bubble_fraction,
    estimate,
    in_flight,
    korthikanti_bytes,
    zero1_partition,
)
from training_harness.workloads import load_workload
from training_harness.workloads.base import Workload

H = 64  # Square's width: every dimension divides by 2 and 4


class Square(MLP):
    """Four equal H x H matrices as blocks: ZeRO's splits come out exact."""

    def __init__(self) -> None:
        super().__init__(d_in=H, hidden=H, d_out=H)

    def build_model(self) -> nn.Module:
        model = nn.Module()
        model.blocks = nn.ModuleList(nn.Linear(H, H, bias=False) for _ in range(4))
        model.forward = lambda x: model.blocks[3](model.blocks[2](F.gelu(
            model.blocks[1](model.blocks[0](x)))))
        return model


PSI = 4 * H * H


def square_plan(ranks: int, **strategies) -> Plan:
    return Plan(workload="mlp", layout=Layout(data=ranks), micro_batch_size=2,
                strategies=strategies)


def state(e) -> tuple[int, int, int]:
    return e.memory["parameters"], e.memory["gradients"], e.memory["optimizer_state"]


# --- ZeRO and DDP ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_zero_state_per_stage_is_the_formula(n):
    w = Square()
    assert state(estimate(square_plan(n, ddp={}), w, CUDA)) == (4 * PSI, 4 * PSI, 8 * PSI)
    zero = {s: estimate(square_plan(n, zero={"stage": s}), w, CUDA) for s in (1, 2, 3)}
    assert state(zero[1]) == (4 * PSI, 4 * PSI, 8 * PSI // n)  # optimizer state split
    assert state(zero[2]) == (4 * PSI // n, 4 * PSI // n, 8 * PSI // n)  # + gradients
    assert state(zero[3]) == (4 * PSI // n, 4 * PSI // n, 8 * PSI // n)  # + parameters
    assert zero[2].to_record()["sharding"]["stage"] == 2


def test_zero3_offload_puts_the_shards_on_the_cpu():
    plan = square_plan(2, zero={"stage": 3, "offload": True})
    cuda, cpu = estimate(plan, Square(), CUDA), estimate(plan, Square(), CPU)
    assert state(cuda) == (0, 0, 0)
    assert cuda.memory["optimizer_temporaries"] == 0  # the optimizer steps on the CPU
    assert cuda.to_record()["sharding"]["cpu_bytes"] == 16 * PSI // 2
    assert state(cpu) == (2 * PSI, 2 * PSI, 4 * PSI)  # on a CPU device nothing moves


def test_zero1_gives_whole_parameters_to_the_emptiest_rank():
    assert zero1_partition([10, 30, 20, 5], 2) == [[1, 3], [2, 0]]
    w = load_workload("gpt", {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256})
    plan = Plan(workload="gpt", layout=Layout(data=2), micro_batch_size=2,
                strategies={"zero": {"stage": 1}})
    e = estimate(plan, w, CUDA)
    full = 8 * sum(p.numel() for p in w.build_model().parameters())
    largest = 8 * 256 * 64  # the embedding, alone on its rank
    assert full / 2 <= e.memory["optimizer_state"] <= full / 2 + largest


def test_fsdp_keeps_gathered_parameters_by_stage():
    w = Square()
    two = estimate(square_plan(2, zero={"stage": 2}), w, CUDA)
    three = estimate(square_plan(2, zero={"stage": 3}), w, CUDA)
    assert two.memory["gathered_parameters"] == 4 * PSI  # all of them, forward to backward
    assert three.memory["gathered_parameters"] == 4 * 2 * H * H  # one block and the next
    mixed = estimate(square_plan(2, zero={"stage": 2}, amp={}), w, CUDA)
    assert mixed.memory["gathered_parameters"] == 2 * PSI  # bf16 copies of fp32 shards
    assert mixed.memory["autocast_weight_copies"] == 0  # nothing left for autocast to cast
    own = estimate(square_plan(2, zero={"stage": 2, "mixed_precision": False}, amp={}), w, CUDA)
    assert own.memory["gathered_parameters"] == 4 * PSI
    assert own.memory["autocast_weight_copies"] > 0


def test_ddp_buckets_hold_the_gradients_all_step():
    w = Square()
    replicas = estimate(square_plan(2), w, CUDA)  # a layout nothing splits
    ddp = estimate(square_plan(2, ddp={}), w, CUDA)
    copy = estimate(square_plan(2, ddp={"gradient_as_bucket_view": False}), w, CUDA)
    assert ddp.phases["forward_end"] == replicas.phases["forward_end"] + 4 * PSI
    assert ddp.memory["gradient_buckets"] == 0
    assert copy.memory["gradient_buckets"] == 4 * PSI
    assert copy.peak_memory_bytes == replicas.peak_memory_bytes + 4 * PSI
    compressed = estimate(square_plan(2, ddp={"compression": "fp16"}), w, CUDA)
    assert compressed.memory["communication_buffers"] == 4 * PSI // 2  # < one bucket


def test_distributed_strategies_are_modelled():
    e = estimate(square_plan(2, zero={"stage": 2}), Square(), CUDA)
    assert any(a.startswith("ZeRO stage 2 (FSDP2) over 2 data ranks") for a in e.assumptions)
    assert any(a.startswith("Communication time is modelled on a GPU") for a in e.assumptions)
    assert not any("Not modelled" in a for a in e.assumptions)


# --- pipeline ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "m", "v", "bubble"),
    [(1, 8, 1, 0.0), (2, 2, 1, 1 / 3), (4, 8, 1, 3 / 11), (4, 8, 2, 3 / 19), (8, 64, 1, 7 / 71)],
)
def test_bubble_fraction(p, m, v, bubble):
    assert bubble_fraction(p, m, v) == pytest.approx(bubble)


def test_micro_batches_in_flight_by_schedule():
    def flight(schedule: str, p: int, m: int, v: int = 1) -> list[list[int]]:
        par = Parallelism(pipeline=p, virtual=v, schedule=schedule, microbatches=m)
        return [in_flight(par, r) for r in range(p)]

    assert flight("gpipe", 4, 8) == [[8]] * 4
    assert flight("1f1b", 4, 8) == [[4], [3], [2], [1]]
    assert flight("1f1b", 4, 2) == [[2], [2], [2], [1]]
    # Interleaved, p = 2, v = 2, m = 4: rank 0 warms up with (v - 1)·2 + 2 = 4 forwards
    # and does one more: stages 0, 0, 1, 1, 0.
    assert flight("interleaved-1f1b", 2, 4, 2) == [[3, 2], [2, 1]]


def test_interleaved_warm_up_is_torchs():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    warmup = getattr(schedules, "_get_warmup_ops", None)
    if warmup is None:
        pytest.skip("this torch computes the warm-up elsewhere")
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 4, 3), (2, 8, 4)]:
        par = Parallelism(pipeline=p, virtual=v, schedule="interleaved-1f1b", microbatches=m)
        per_round = m // max(1, m // p)
        for r in range(p):
            expected = min(warmup(r, v, per_round, p, m, multiply_factor=2) + 1, m * v)
            assert sum(in_flight(par, r)) == expected, (p, m, v, r)


GPT = {"layers": 4, "heads": 4, "hidden": 64, "seq_len": 32, "vocab": 256, "tie_weights": False}


def gpt(layout: Layout, global_batch: int | None = None, **strategies) -> tuple[Plan, Workload]:
    plan = Plan(workload="gpt", workload_args=GPT, layout=layout, micro_batch_size=2,
                global_batch_size=global_batch, strategies=strategies)
    return plan, load_workload("gpt", GPT)


def test_pipeline_stages_hold_their_blocks_and_activations_in_flight():
    one, w = gpt(Layout(), 8, accumulation={})
    single = estimate(one, w, CUDA, 1e12)
    plan, _ = gpt(Layout(pipeline=2), 8, pipeline={"schedule": "1f1b"})
    e = estimate(plan, w, CUDA, 1e12)
    pipe = e.to_record()["pipeline"]
    assert pipe["bubble"] == pytest.approx(1 / 5)  # p = 2, m = 4
    assert pipe["in_flight"] == [[2], [1]]
    assert sum(pipe["stage_parameters_bytes"]) == single.memory["parameters"]
    assert e.peak_memory_bytes == max(pipe["stage_memory_bytes"])
    # Rank 0: 2 blocks x 2 micro-batches in flight, as many as 4 blocks x 1 on one device.
    assert pipe["largest_rank"] == 0
    assert e.memory["activations"] == single.memory["activations"]
    assert e.memory["logits"] == 0  # the loss is the last stage's
    # Rank 0 keeps a gradient receive buffer per micro-batch (4) and its output per
    # micro-batch in flight (2), each an fp32 s x b x h residual stream.
    assert e.memory["pipeline_buffers"] == (4 + 2) * 4 * GPT["seq_len"] * 2 * GPT["hidden"]
    # compute (a slow device: it dominates) halves per stage, stretched by the bubble
    slow, slow_single = estimate(plan, w, CUDA, 1e9), estimate(one, w, CUDA, 1e9)
    assert slow.step_time_s == pytest.approx(slow_single.step_time_s / 2 / (1 - 1 / 5),
                                             rel=0.02)
    gpipe = estimate(gpt(Layout(pipeline=2), 8, pipeline={"schedule": "gpipe"})[0], w, CUDA)
    assert gpipe.to_record()["pipeline"]["in_flight"] == [[4], [4]]
    assert gpipe.memory["activations"] == 2 * single.memory["activations"]


# --- tensor parallel ---------------------------------------------------------------------


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_terms_give_korthikanti_eq2(t):
    s, b, h, a = SHAPE.seq_len, 2, SHAPE.hidden, SHAPE.heads
    terms = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=True, tensor=t)
    eq2 = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert sum(terms.values()) == pytest.approx(eq2)
    assert sum(terms.values()) == korthikanti_bytes(SHAPE, b, tensor=t)
    whole = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=True)
    assert terms["ln1_input"] == whole["ln1_input"]  # outside the split
    assert terms["q_and_k"] * t == whole["q_and_k"]  # inside it


def test_tensor_parallel_splits_block_weights_and_activations():
    one, w = gpt(Layout())
    two, _ = gpt(Layout(tensor=2), tensor={})
    attention_only, _ = gpt(Layout(tensor=2), tensor={"mlp": False})
    e1, e2, ea = (estimate(p, w, CUDA) for p in (one, two, attention_only))
    h, layers = GPT["hidden"], GPT["layers"]
    qkv, proj = 3 * h * h + 3 * h, h * h  # colwise: weight and bias; rowwise: weight
    mlp = 4 * h * h + 4 * h + 4 * h * h
    assert e1.memory["parameters"] - e2.memory["parameters"] == 4 * layers * (qkv + proj + mlp) // 2
    assert e1.memory["parameters"] - ea.memory["parameters"] == 4 * layers * (qkv + proj) // 2
    assert e2.block_terms["gelu_input"] * 2 == e1.block_terms["gelu_input"]
    assert ea.block_terms["gelu_input"] == e1.block_terms["gelu_input"]
    assert e2.block_terms["ln2_input"] == e1.block_terms["ln2_input"]
    assert e2.memory["activations"] == layers * sum(e2.block_terms.values())


def test_summary_names_the_split():
    plan, w = gpt(Layout(pipeline=2, data=2), 16, pipeline={}, zero={"stage": 3})
    text = estimate(plan, w, CUDA, 1e12).summary()
    assert "zero stage 3 over 2 ranks" in text and "bubble" in text
