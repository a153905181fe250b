"""timm: workloads: built with their sizes, blocks found from timm's own group matcher
(and through the wrappers strategies put on them), checkpointing exact against fp32,
the estimator's trace, and mistakes refused in one line; torchvision's builders that
the meta device or an image size trip."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from tests.tiny import train
from tests.workloads.tiny_hf import needs_torchvision
from training_harness.cli.main import main
from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.estimator import estimate
from training_harness.workloads import load_workload
from training_harness.workloads.blocks import find_blocks


@pytest.fixture(autouse=True)
def one_thread():
    """Small models' many small ops: one thread is faster on a shared CPU, and exact."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def needs_timm() -> None:
    from training_harness.workloads import optional

    try:
        optional.require("timm", "timm")
    except HarnessError as e:
        pytest.skip(str(e))


SMALL = {"num_classes": 4, "image_size": 64}

BLOCKS = {
    "resnet18": (("layer1", "layer2", "layer3", "layer4"), "BasicBlock", 8),
    "vit_tiny_patch16_224": (("blocks",), "Block", 12),
    "convnext_atto": (tuple(f"stages.{i}.blocks" for i in range(4)), "ConvNeXtBlock", 12),
    "efficientnet_b0": (tuple(f"blocks.{i}" for i in range(7)),
                        "DepthwiseSeparableConv/InvertedResidual", 16),
    "swin_tiny_patch4_window7_224": (tuple(f"layers.{i}.blocks" for i in range(4)),
                                     "SwinTransformerBlock", 12),
    # a dense layer's input is a list its block grows: the block is checkpointed whole
    "densenet121": (("features",), "DenseBlock", 4),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_blocks_come_from_timms_group_matcher(name):
    needs_timm()
    workload = load_workload(f"timm:{name}", SMALL)
    with torch.device("meta"):
        model = workload.build_model()
    blocks = find_blocks(model)
    assert (blocks.paths, blocks.name, len(blocks)) == BLOCKS[name]
    before = blocks.prefixes()
    for i in range(len(blocks)):
        blocks[i] = checkpoint_wrapper(blocks[i])
    again = find_blocks(model)  # seen through the wrappers: the same slots
    assert again.prefixes() == before and again.name == blocks.name


def test_sizes_follow_the_arguments():
    needs_timm()
    vit = load_workload("timm:vit_tiny_patch16_224", {"num_classes": 3, "image_size": 32})
    with torch.device("meta"):
        model = vit.build_model()
    assert model.pos_embed.shape[1] == (32 // 16) ** 2 + 1  # built for 32 px
    assert model.head.out_features == 3
    images, labels = vit.batch(2, 0, "cpu")
    assert images.shape == (2, 3, 32, 32) and int(labels.max()) < 3
    gray = load_workload("timm:resnet18", {"num_classes": 2, "image_size": 32, "in_chans": 1})
    assert gray.batch(2, 0, "cpu")[0].shape == (2, 1, 32, 32)
    assert load_workload("timm:resnet18").image_size == 224  # the model's own


def test_resnet18_checkpointed_trains_as_fp32():
    needs_timm()
    workload = load_workload("timm:resnet18", {"num_classes": 4, "image_size": 32})
    base = train({}, workload=workload, micro=4, global_batch=4, steps=2, lr=1e-3)
    ckpt = train({"checkpoint": {}}, workload=workload, micro=4, global_batch=4, steps=2,
                 lr=1e-3)
    assert ckpt == pytest.approx(base, abs=1e-4)


def test_the_estimator_traces_a_checkpointed_vit():
    """Traced, not by formula (no TransformerShape): checkpointing its 12 blocks keeps
    only their inputs, a small part of the activations."""
    needs_timm()
    workload = load_workload("timm:vit_tiny_patch16_224", {"num_classes": 4, "image_size": 32})
    assert workload.shape is None
    env = RuntimeEnv.detect("cpu")
    found = {}
    for label, strategies in (("off", {}), ("on", {"checkpoint": {}})):
        plan = Plan(workload="timm:vit_tiny_patch16_224", micro_batch_size=4,
                    global_batch_size=4, device="cpu", strategies=strategies)
        found[label] = estimate(plan, workload, env)
    on, off = found["on"], found["off"]
    assert 0 < 5 * on.memory["activations"] < off.memory["activations"]
    assert on.memory["recompute"] > 0 == off.memory["recompute"]
    assert any("(12 of 12)" in a for a in on.assumptions)


@pytest.mark.parametrize("name, args, words", [
    ("timm:resnet181", {}, ["has no model 'resnet181'", "did you mean 'resnet18'"]),
    ("timm:hf-hub:timm/resnet18.a1_in1k", {}, ["not downloaded", "e.g. timm:resnet18"]),
    ("timm:resnet18", {"pretrained": True}, ["'pretrained' is not taken", "drop it"]),
    ("timm:resnet18", {"bogus": 1}, ["unexpected keyword argument 'bogus'"]),
    ("timm:resnet18", {"num_classes": 0}, ["num_classes must be a whole number"]),
    ("timm:", {}, ["name the model after 'timm:'", "timm:resnet18"]),
    ("torchvision:vit_b_16", {"image_size": 20}, ["indivisible by patch size"]),
    ("torchvision:maxvit_t", {"image_size": 64}, ["not divisible by partition size"]),
])
def test_mistakes_are_one_line(name, args, words):
    needs_timm() if name.startswith("timm") else needs_torchvision()
    with pytest.raises(HarnessError) as e:
        load_workload(name, args)
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_torchvision_regnet_builds_on_the_meta_device():
    """Its builder computes the widths with tensors, which the meta device cannot read:
    built on the CPU and moved, so the FLOP count and the estimator see it."""
    needs_torchvision()
    workload = load_workload("torchvision:regnet_x_400mf", {"num_classes": 4, "image_size": 32})
    with torch.device("meta"):
        model = workload.build_model()
    assert all(p.is_meta for p in model.parameters())
    assert find_blocks(model).name == "ResBottleneckBlock"


def test_an_unknown_timm_model_exits_2_in_one_line(tmp_path, capsys):
    # in this process, as tests/test_cli.py's mistakes: a new interpreter would start its
    # own rank server (torch imported again) to prove the same line
    needs_timm()
    out = tmp_path / "never"
    code = main(["bench", "--workload", "timm:vit_tiny_patch16_2244", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "vit_tiny_patch16_224" in lines[0], err
    assert not out.exists()
