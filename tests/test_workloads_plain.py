"""A plain nn.Module as a workload (Workload.from_callables, @workload), and the block
finder on every kind of model: the right layers, and the same ones through wrappers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from tests.tiny import tiny_gpt, train
from tests.workloads.plain_module import make_batch
from training_harness.core.errors import HarnessError
from training_harness.strategies.compose import compose
from training_harness.workloads import Workload, load_workload
from training_harness.workloads.blocks import find_blocks

PLAIN = "tests.workloads.plain_module:build"


def test_the_decorated_builder_is_a_workload_with_its_arguments():
    workload = load_workload(PLAIN, {"width": 8, "depth": 2})
    model = workload.build_model()
    assert model[0].out_features == 8 and len(model[1]) == 2
    x, y = workload.batch(4, 3, "cpu")
    assert torch.equal(x, make_batch(4, 3)[0])
    assert workload.loss(model, (x, y)).ndim == 0
    assert workload.flops_per_sample() > 0  # counted by torch's FLOP counter
    with pytest.raises(HarnessError, match="unexpected keyword argument 'widht'"):
        load_workload(PLAIN, {"widht": 8})


def test_from_callables_defaults_to_the_models_own_loss():
    class Scored(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 1)

        def forward(self, x, y):
            return ((self.lin(x) - y) ** 2).mean()

    w = Workload.from_callables(Scored, lambda b, i: (torch.ones(b, 4), torch.zeros(b, 1)),
                                name="scored", flops_per_sample=10.0)
    assert w.name == "scored" and w.flops_per_sample() == 10.0
    assert w.loss(w.build_model(), w.batch(2, 0, "cpu")).ndim == 0


def test_checkpointing_a_plain_module_uses_the_blocks_found():
    workload = load_workload(PLAIN, {"depth": 4})
    base = train({}, workload=workload)
    setup = compose(workload.build_model(), {"checkpoint": {}}, "cpu")
    assert setup.notes == ["checkpoint (full): 4 of 4 x Sequential in 1"]
    assert train({"checkpoint": {}}, workload=workload) == pytest.approx(base, abs=1e-6)


def test_the_gpts_own_blocks_are_taken_at_their_word():
    blocks = find_blocks(tiny_gpt().build_model())
    assert blocks.paths == ("blocks",) and blocks.name == "Block" and len(blocks) == 2


def test_a_model_without_repeated_layers_has_no_blocks():
    assert find_blocks(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))) is None
    setup_error = "no repeated layers to checkpoint"
    with pytest.raises(HarnessError, match=setup_error):
        compose(nn.Sequential(nn.Linear(2, 3), nn.ReLU()), {"checkpoint": {}}, "cpu")


def test_wrappers_are_seen_through():
    workload = load_workload(PLAIN, {"depth": 4})
    model = workload.build_model()
    blocks = find_blocks(model)
    blocks[0] = checkpoint_wrapper(blocks[0])  # every = 2: wrapped and plain ones mixed
    blocks[2] = checkpoint_wrapper(blocks[2])
    again = find_blocks(model)
    assert again.paths == ("1",) and len(again) == 4 and again[0] is blocks[0]


HF = {"llama": ("model.layers", "LlamaDecoderLayer"), "gpt2": ("transformer.h", "GPT2Block"),
      "bert": ("bert.encoder.layer", "BertLayer")}


@pytest.mark.parametrize("model_type", list(HF))
def test_hf_decoder_layers_are_found(model_type):
    from tests.workloads.tiny_hf import needs_transformers, tiny_hf

    needs_transformers()
    blocks = find_blocks(tiny_hf(model_type).build_model())
    assert (blocks.paths, blocks.name, len(blocks)) == ((HF[model_type][0],), HF[model_type][1], 2)


TV = {
    "resnet50": (("layer1", "layer2", "layer3", "layer4"), "Bottleneck", 16),
    "vit_b_16": (("encoder.layers",), "EncoderBlock", 12),
    "convnext_tiny": (("features.1", "features.3", "features.5", "features.7"), "CNBlock", 18),
}


@pytest.mark.parametrize("name", list(TV))
def test_torchvision_stages_are_found(name):
    from tests.workloads.tiny_hf import needs_torchvision

    needs_torchvision()
    workload = load_workload(f"torchvision:{name}", {"num_classes": 10})
    with torch.device("meta"):
        blocks = find_blocks(workload.build_model())
    assert (blocks.paths, blocks.name, len(blocks)) == TV[name]
