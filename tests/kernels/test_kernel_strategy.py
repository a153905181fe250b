"""The `fused` strategy with every Triton kernel on: same losses as the plain GPT.

Through compose, as a user's plan would: FusedLayerNorm, bias+GELU, the chunked
cross-entropy and the multi-tensor optimizer, in Triton (the interpreter on a
CPU). Tolerance: 1e-4 absolute on a loss of about 4 over 3 steps (fp32; the
kernels round differently from eager PyTorch, observed ~1e-6).

Batches of 2 sequences of 8 tokens (16 rows), not 8 of 16: on the CPU the interpreter
runs one program per row, so the time grows with the rows (8 sequences took 3 times as
long as 2, 16 tokens twice as long as 8). Three steps: the third is the first that
reads the optimizer's state of an earlier step (its moments, the step count). Each
kernel is checked at many shapes against float64 in its own file; this one checks
that compose puts them together into a model that trains like eager.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.tiny import tiny_gpt, train  # noqa: E402
from training_harness.kernels.bias_gelu import LinearBiasGELU  # noqa: E402
from training_harness.kernels.cross_entropy import ChunkedCrossEntropy  # noqa: E402
from training_harness.kernels.layernorm import FusedLayerNorm  # noqa: E402
from training_harness.kernels.multi_tensor import MultiTensorAdamW  # noqa: E402
from training_harness.strategies.compose import compose  # noqa: E402
from training_harness.strategies.lamb import Lamb  # noqa: E402
from training_harness.workloads.attention import SdpaAttention  # noqa: E402

ALL_TRITON = {"layernorm": "triton", "gelu": "triton", "cross_entropy": "triton",
              "optimizer": "triton", "attention": "explicit"}


def test_fused_triton_swaps_every_module(device):
    with torch.device(device):
        model = tiny_gpt().build_model()
    setup = compose(model, {"fused": ALL_TRITON}, device)
    kinds = {type(m) for m in setup.model.modules()}
    assert {FusedLayerNorm, LinearBiasGELU, ChunkedCrossEntropy} <= kinds
    assert SdpaAttention not in kinds
    assert isinstance(setup.optimizer, MultiTensorAdamW)


@pytest.mark.parametrize("optimizer", [{}, {"lamb": {}}])
def test_fused_triton_trains_like_eager(optimizer, device):
    run = dict(micro=2, global_batch=2, steps=3, device=device)
    plain = train(dict(optimizer), workload=tiny_gpt(seq_len=8), **run)
    fused = train({"fused": ALL_TRITON, **optimizer}, workload=tiny_gpt(seq_len=8), **run)
    assert max(abs(a - b) for a, b in zip(fused, plain, strict=True)) < 1e-4, (fused, plain)


def test_lamb_triton_is_the_multi_tensor_kernel(device):
    with torch.device(device):
        model = tiny_gpt().build_model()
    setup = compose(model, {"fused": ALL_TRITON, "lamb": {}}, device)
    assert isinstance(setup.optimizer, Lamb) and setup.optimizer.fused
