"""The Triton multi-tensor optimizer on sharded (DTensor) parameters, and where it is
refused.

A DTensor's own data_ptr() is 0, so before MultiTensorAdamW stepped each rank's
shard, a plan with FSDP (zero stage 2/3) or tensor parallel and fused optimizer =
'triton' launched the kernel on address 0. Here a one-rank gloo group (an in-process
HashStore: no port) shards the parameters over a one-device CPU mesh, and the step
must equal torch's AdamW on the same plain tensors, within the kernel tests' fp32
tolerance (rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("triton")

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # noqa: E402

from training_harness.core.device import RuntimeEnv  # noqa: E402
from training_harness.core.plan import Layout, Plan  # noqa: E402
from training_harness.kernels.multi_tensor import MultiTensorAdamW  # noqa: E402
from training_harness.strategies.compose import reasons_against  # noqa: E402

SHAPES = [(8, 5), (3,), (1025,)]


@pytest.fixture
def cpu_mesh():
    if not dist.is_available():
        pytest.skip("torch.distributed is not built here")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_multi_tensor_adamw_steps_the_shards_of_dtensor_parameters(cpu_mesh, device):
    if device != "cpu":
        pytest.skip("the mesh here is a CPU one")
    torch.manual_seed(0)
    plain = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    sharded = [torch.nn.Parameter(distribute_tensor(p.detach().clone(), cpu_mesh, [Shard(0)]))
               for p in plain]
    ours = MultiTensorAdamW(sharded, lr=1e-2, weight_decay=0.1, impl="triton")
    theirs = torch.optim.AdamW(plain, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        grads = [torch.randn(s) for s in SHAPES]
        for p, q, g in zip(plain, sharded, grads, strict=True):
            p.grad = g.clone()
            q.grad = distribute_tensor(g.clone(), cpu_mesh, [Shard(0)])
        theirs.step()
        ours.step()
    for p, q in zip(plain, sharded, strict=True):
        assert isinstance(q, DTensor)
        torch.testing.assert_close(q.full_tensor(), p.detach(), rtol=1e-5, atol=1e-6)
        assert isinstance(ours.state[q]["exp_avg"], DTensor)  # state stays sharded


CUDA = RuntimeEnv("cuda", "H100", 8, bf16=True, triton=True)
GPT = dict(layers=4, heads=4, hidden=64, seq_len=16, vocab=64, tie_weights=False)
TRITON = {"optimizer": "triton"}


def _plan(strategies, **layout) -> Plan:
    return Plan(workload_args=GPT, layout=Layout(**layout), micro_batch_size=2,
                strategies=strategies)


@pytest.mark.parametrize(("strategies", "layout", "expected"), [
    ({"fused": TRITON, "lamb": {}, "zero": {"stage": 3}}, {"data": 2},
     "LAMB's trust ratio needs each tensor's whole norm, and with zero stage 2/3"),
    ({"fused": TRITON, "lamb": {}, "zero": {"stage": 2}, "tensor": {}}, {"data": 2, "tensor": 2},
     "with zero stage 2/3 and tensor parallel a rank's kernel sees one shard"),
    ({"fused": TRITON, "zero": {"stage": 3, "offload": True}}, {"data": 2},
     "with zero offload: the optimizer steps parameters held on the CPU"),
])
def test_triton_optimizer_refused_where_it_cannot_step(strategies, layout, expected):
    reasons = "; ".join(reasons_against(_plan(strategies, **layout), CUDA))
    assert expected in reasons


@pytest.mark.parametrize(("strategies", "layout"), [
    ({"fused": TRITON, "zero": {"stage": 3}}, {"data": 2}),       # AdamW: shards step alone
    ({"fused": TRITON, "lamb": {}, "zero": {"stage": 1}}, {"data": 2}),  # whole tensors
    ({"fused": {"optimizer": "foreach"}, "lamb": {}, "zero": {"stage": 3}}, {"data": 2}),
])
def test_triton_optimizer_allowed_where_it_steps_whole_or_elementwise(strategies, layout):
    assert not [r for r in reasons_against(_plan(strategies, **layout), CUDA)
                if "optimizer = 'triton'" in r]
