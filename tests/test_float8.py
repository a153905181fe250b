"""float8 (torchao) on the CPU through torchao's emulation against the bf16 run, the
module filter, the place in the order, and the refusals."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from torch import nn

from tests.tiny import tiny_gpt, train
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.strategies import registry
from training_harness.strategies.base import Phase
from training_harness.strategies.compose import compose
from training_harness.strategies.float8 import Float8Settings, linear_filter

# Not imported at collection (torchao costs each xdist worker 1.7 s there): the first test
# that trains imports it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                reason="needs torchao (the `fp8` extra)")

CPU = RuntimeEnv.detect("cpu")
# Five steps of the tiny GPT at lr 3e-3 (loss 4.17 -> 3.77): float8's e4m3 casts (3
# mantissa bits) against bf16 autocast's (8 bits) moved the losses by at most 4.5e-3
# (tensorwise) and 1.5e-3 (rowwise) here; the tolerance leaves 4x of that.
FP8_VS_BF16 = 2e-2
LR = 3e-3


@pytest.fixture(scope="module")
def bf16():
    return train({"amp": {"dtype": "bf16"}}, workload=tiny_gpt(hidden=64), lr=LR)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_float8_matches_the_bf16_run(bf16, recipe):
    losses = train({"amp": {"dtype": "bf16"},
                    "float8": {"recipe": recipe, "emulate": True}}, workload=tiny_gpt(hidden=64),
                   lr=LR)
    diffs = [abs(a - b) for a, b in zip(losses, bf16, strict=True)]
    assert max(diffs) <= FP8_VS_BF16, diffs
    assert losses[-1] < losses[0]  # it learns


def test_the_filter_keeps_first_last_and_small_linears():
    workload = tiny_gpt(hidden=64)
    torch.manual_seed(0)
    setup = compose(workload.build_model(),
                               {"float8": {"emulate": True}}, "cpu")
    from torchao.float8.float8_linear import Float8Linear

    kinds = {n: isinstance(m, Float8Linear) for n, m in setup.model.named_modules()
             if isinstance(m, nn.Linear)}
    assert not kinds["blocks.0.qkv"] and not kinds["lm_head"]  # the first and the last
    assert all(v for n, v in kinds.items() if n not in ("blocks.0.qkv", "lm_head")), kinds
    assert any("float8 (tensorwise, emulated): 7 of 9 linears" in n for n in setup.notes), \
        setup.notes
    small = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 30), nn.Linear(30, 64),
                          nn.Linear(64, 64), nn.Linear(64, 64))
    keep = linear_filter(small)
    assert [keep(m, n) for n, m in small.named_children()] == [False, False, False, True, False]
    assert [keep(m, n) for n, m in small.named_children()][3]
    everything = linear_filter(small, keep_first_last=False)
    assert [everything(m, n) for n, m in small.named_children()] == [True, False, False, True,
                                                                     True]


def test_after_tensor_parallel_before_data_parallel():
    f8 = registry.get("float8").phases
    assert min(f8) > Phase.TENSOR_PARALLEL and max(f8) < Phase.CHECKPOINT < Phase.DATA_PARALLEL
    assert set(registry.get("float8").space()["recipe"].values) == {"tensorwise", "rowwise"}


def test_refusals(monkeypatch):
    f8 = registry.get("float8")
    (cpu,) = f8.check(Float8Settings(), Plan(), CPU)
    assert "compute capability 8.9" in cpu and "cpu has none" in cpu
    assert f8.check(Float8Settings(emulate=True), Plan(), CPU) == []
    h100 = replace(CPU, device_type="cuda", device_name="NVIDIA H100")
    monkeypatch.setattr("training_harness.strategies.float8.cuda_capability", lambda: (9, 0))
    assert f8.check(Float8Settings(), Plan(), h100) == []
    monkeypatch.setattr("training_harness.strategies.float8.cuda_capability", lambda: (8, 0))
    (a100,) = f8.check(Float8Settings(), Plan(), replace(h100, device_name="A100"))
    assert "8.9" in a100 and "A100 is 8.0" in a100
    monkeypatch.setattr("training_harness.strategies.float8.cuda_capability", lambda: (9, 0))
    tp = Plan(layout=Layout(tensor=2))
    assert any("tensor parallel" in r for r in f8.check(Float8Settings(), tp, h100))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchao" else real(name, *a))
    (absent,) = f8.check(Float8Settings(), Plan(), h100)
    assert "torchao" in absent and "[fp8]" in absent
