"""The ResNet, ViT and MLP workloads, and the example user workload."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.user_workload import build as build_user
from training_harness.core.errors import HarnessError
from training_harness.workloads.base import TransformerShape, Workload
from training_harness.workloads.mlp import build_mlp
from training_harness.workloads.vision import build_resnet, build_vit

SMALL = {
    "resnet": lambda: build_resnet(widths=[8, 16], blocks_per_stage=1, image_size=16),
    "vit": lambda: build_vit(layers=2, hidden=32, heads=4, patch_size=4, image_size=16),
    "mlp": lambda: build_mlp(in_features=16, hidden=32, layers=2, out_features=5),
    "mlp-regression": lambda: build_mlp(
        in_features=16, hidden=32, layers=2, out_features=5, task="regression"
    ),
    "user": lambda: build_user(width=8),
}
NAMES = {"resnet": "resnet", "vit": "vit", "mlp": "mlp", "mlp-regression": "mlp",
         "user": "sum-regression"}
BLOCKS = {"resnet": 2, "vit": 2, "mlp": 2, "mlp-regression": 2, "user": 2}


def assert_batches_equal(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


@pytest.fixture(params=sorted(SMALL))
def kind(request) -> str:
    return request.param


def test_builds_with_blocks(kind: str) -> None:
    wl = SMALL[kind]()
    assert isinstance(wl, Workload)
    assert wl.name == NAMES[kind]
    model = wl.build_model()
    assert isinstance(model.blocks, nn.ModuleList)
    assert len(model.blocks) == BLOCKS[kind]


def test_batch_is_seeded_by_index(kind: str) -> None:
    wl = SMALL[kind]()
    state = torch.random.get_rng_state()
    a, b = wl.batch(4, 7, "cpu"), wl.batch(4, 7, "cpu")
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert_batches_equal(a, b)
    c = wl.batch(4, 8, "cpu")
    assert not torch.equal(a[0], c[0])
    # Larger batches are drawn the same way, whatever the batch size.
    assert a[0].shape[0] == 4 and wl.batch(6, 7, "cpu")[0].shape[0] == 6


def test_loss_is_finite_scalar_with_grads_for_every_parameter(kind: str) -> None:
    wl = SMALL[kind]()
    torch.manual_seed(0)
    model = wl.build_model()
    loss = wl.loss(model, wl.batch(4, 0, "cpu"))
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


def test_training_lowers_the_loss_on_a_fixed_batch(kind: str) -> None:
    wl = SMALL[kind]()
    torch.manual_seed(0)
    model = wl.build_model()
    batch = wl.batch(16, 3, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = wl.loss(model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses


def test_flops_and_parameters_on_meta(kind: str) -> None:
    wl = SMALL[kind]()
    assert wl.name == NAMES[kind]
    with torch.device("meta"):
        meta = wl.build_model()
    real = wl.build_model()
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in real.parameters())
    flops = wl.flops_per_sample()
    assert flops > 0 and math.isfinite(flops)


def test_meta_batches_have_the_real_shapes(kind: str) -> None:
    wl = SMALL[kind]()
    real, meta = wl.batch(3, 0, "cpu"), wl.batch(3, 0, "meta")
    for r, m in zip(real, meta, strict=True):
        assert m.device.type == "meta"
        assert (m.shape, m.dtype) == (r.shape, r.dtype)


# --- MLP: exact sizes ---------------------------------------------------------


def test_mlp_parameter_count_and_flops() -> None:
    i, h, n, o = 16, 32, 3, 5
    wl = build_mlp(in_features=i, hidden=h, layers=n, out_features=o)
    params = (i * h + h) + n * (h * h + h) + (h * o + o)
    assert sum(p.numel() for p in wl.build_model().parameters()) == params
    # The counter counts matrix multiplies only (not biases, GELU or the loss):
    # forward 2 per weight per sample, backward 2 for the weight gradient and 2
    # for the input gradient -- except the first layer, whose input (the data)
    # needs no gradient. So 6 x weights - 2 x the first layer's weights.
    weights = i * h + n * h * h + h * o
    assert wl.flops_per_sample() == 6 * weights - 2 * i * h


def test_mlp_default_sizes() -> None:
    c = build_mlp().config
    assert (c.in_features, c.hidden, c.layers, c.out_features, c.task) == (
        256, 1024, 4, 10, "classification"
    )


# --- ResNet and ViT ---------------------------------------------------------------


def test_resnet_blocks_flatten_stages_and_downsample() -> None:
    wl = build_resnet(widths=[8, 16, 32], blocks_per_stage=2, image_size=16, num_classes=7)
    model = wl.build_model()
    assert len(model.blocks) == 6
    images, labels = wl.batch(2, 0, "cpu")
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and int(labels.max()) < 7
    assert model(images).shape == (2, 7)


def test_vit_shape() -> None:
    wl = build_vit(layers=3, hidden=48, heads=6, mlp_ratio=2, patch_size=8, image_size=32,
                   num_classes=100, dropout=0.1)
    assert wl.shape == TransformerShape(
        layers=3, hidden=48, heads=6, seq_len=(32 // 8) ** 2 + 1, vocab=100, ffn_hidden=96,
        dropout=0.1,
    )
    assert len(wl.build_model().blocks) == 3


def test_vit_flops_match_the_transformer_estimate() -> None:
    # 6N per token for the weights plus 12·L·H·T per token for attention scores.
    wl = build_vit(layers=4, hidden=64, heads=4, patch_size=4, image_size=32)
    s = wl.shape
    n = sum(p.numel() for p in wl.build_model().parameters())
    estimate = 6 * n * s.seq_len + 12 * s.layers * s.hidden * s.seq_len**2
    assert 0.9 < wl.flops_per_sample() / estimate < 1.1


# --- bad arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "args", "key"),
    [
        (build_resnet, {"width": [8]}, "width"),
        (build_vit, {"layer": 2}, "layer"),
        (build_mlp, {"hiden": 8}, "hiden"),
        (build_resnet, {"widths": []}, "widths"),
        (build_resnet, {"widths": [8, 0]}, "widths[1]"),
        (build_resnet, {"blocks_per_stage": 0}, "blocks_per_stage"),
        (build_resnet, {"image_size": "32"}, "image_size"),
        (build_vit, {"hidden": 30, "heads": 4}, "hidden"),
        (build_vit, {"image_size": 30, "patch_size": 4}, "image_size"),
        (build_vit, {"layers": 0}, "layers"),
        (build_vit, {"mlp_ratio": 0}, "mlp_ratio"),
        (build_vit, {"dropout": 1.0}, "dropout"),
        (build_mlp, {"hidden": -1}, "hidden"),
        (build_mlp, {"task": "ranking"}, "task"),
    ],
)
def test_bad_arguments_name_the_key(builder, args, key) -> None:
    with pytest.raises(HarnessError) as e:
        builder(**args)
    message = str(e.value)
    assert message.startswith("[workload]")
    assert f"'{key}'" in message or f".{key}:" in message, message
