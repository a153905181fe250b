"""hf: workloads' arguments and sources: a saved folder round-trips (weights loaded),
mistakes are HarnessErrors that say what to change, the analytic FLOPs agree with
torch's FLOP counter, and torchvision: models train with their blocks found."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.tiny import train
from tests.workloads.tiny_hf import TINY_HF, needs_torchvision, needs_transformers, tiny_hf
from training_harness.core.errors import HarnessError
from training_harness.workloads import load_workload


@pytest.fixture(scope="module", autouse=True)
def transformers_here():
    needs_transformers()


@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_a_saved_folder_round_trips_with_its_weights(model_type, tmp_path):
    torch.manual_seed(1)
    saved = tiny_hf(model_type).build_model()
    saved.save_pretrained(tmp_path)
    workload = load_workload(f"hf:{tmp_path}", {"seq_len": 16})
    assert workload.source.weights and workload.source.task == tiny_hf(model_type).source.task
    torch.manual_seed(2)  # a fresh initialisation would differ: the weights are the folder's
    loaded = workload.build_model()
    want = saved.state_dict()
    for name, value in loaded.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=0, msg=name)
    batch = workload.batch(2, 0, "cpu")
    assert workload.loss(loaded, batch).item() == pytest.approx(workload.loss(saved, batch).item())


def test_a_folder_with_a_config_only_builds_fresh_weights(tmp_path):
    tiny_hf("llama").config.save_pretrained(tmp_path)
    workload = load_workload(f"hf:{tmp_path}", {"seq_len": 16, "num_hidden_layers": 1})
    assert not workload.source.weights
    assert len(workload.build_model().model.layers) == 1  # arguments override the file


def test_a_bare_name_is_the_model_type_even_beside_a_folder_of_that_name(tmp_path,
                                                                        monkeypatch):
    """`harness bench --workload hf:llama --save llama` makes ./llama; the next hf:llama
    run there is still the model type, and hf:./llama (or sub/llama) the folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama").mkdir()  # a --save folder, not yet written
    args = {"seq_len": 16, "num_hidden_layers": 1, "hidden_size": 32,
            "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
            "vocab_size": 64}
    assert load_workload("hf:llama", args).source.folder is None
    with pytest.raises(HarnessError, match="no config.json in"):
        load_workload("hf:./llama", {"seq_len": 16})
    tiny_hf("llama").config.save_pretrained(tmp_path / "sub" / "llama")
    assert load_workload("hf:sub/llama", {"seq_len": 16}).source.folder == (
        tmp_path / "sub" / "llama")


@pytest.mark.parametrize(("name", "args", "message"), [
    ("hf:lama", {}, "knows no model type 'lama' (did you mean 'llama'?)"),
    ("hf:llama", {"num_hiden_layers": 2}, "'num_hiden_layers' is not a field of LlamaConfig "
                                          "(did you mean 'num_hidden_layers'?)"),
    ("hf:llama", {"attn_implementation": "flash"}, "attn_implementation 'flash' is not one of"),
    ("hf:gpt2", {"seq_len": 4096}, "seq_len 4096 is longer than the model's "
                                   "max_position_embeddings (1024)"),
    ("hf:gpt2", {"task": "masked-lm"}, "transformers has no masked-lm model for 'gpt2'"),
    ("hf:", {}, "name the model after 'hf:'"),
    ("hf:/no/such/folder", {}, "no config.json in /no/such/folder"),
])
def test_mistakes_say_what_to_change(name, args, message):
    with pytest.raises(HarnessError, match=re.escape(message)):
        load_workload(name, args)


def test_causal_lms_predict_the_next_token_and_encoders_masked_ones():
    ids, targets = tiny_hf("llama").batch(2, 0, "cpu")
    assert torch.equal(ids[:, 1:], targets[:, :-1])
    ids, labels = tiny_hf("bert").batch(2, 0, "cpu")
    masked = labels != -100
    assert (masked.sum(1) == 2).all()  # 15% of 16 tokens, the same count in every row
    assert (ids[masked] == 63).all() and (labels[masked] < 63).all()


@pytest.mark.parametrize("model_type", list(TINY_HF))
def test_analytic_flops_agree_with_torchs_counter(model_type):
    """6N + attention per token against the counted matmuls: they differ by what the
    formula leaves out (the LM head's softmax, norms) and puts in (the causal half of
    attention); within 15% at 16 tokens on these tiny models."""
    workload = tiny_hf(model_type)
    model = workload.build_model()
    with FlopCounterMode(display=False) as counter:
        workload.loss(model, workload.batch(2, 0, "cpu")).backward()
    counted = counter.get_total_flops() / 2
    assert workload.flops_per_sample() == pytest.approx(counted, rel=0.15)


@pytest.mark.slow  # resnet18 (11M parameters): runs of 3, 3 and 1 steps
def test_torchvision_resnet_trains_and_checkpoints_per_block():
    """Checkpointing its 8 BasicBlocks: within 1e-4 of the fp32 run over 3 steps. bf16:
    the first step's loss within 2e-2 (a ResNet on batches of 8 amplifies rounding from
    the first update on: 0.18 apart after 3 steps at lr 1e-3, so later steps say nothing)."""
    needs_torchvision()
    workload = load_workload("torchvision:resnet18", {"num_classes": 10, "image_size": 32})
    base = train({}, workload=workload, steps=3, lr=1e-3)
    ckpt = train({"checkpoint": {}}, workload=workload, steps=3, lr=1e-3)
    assert ckpt == pytest.approx(base, abs=1e-4)
    bf16 = train({"amp": {"dtype": "bf16"}}, workload=workload, steps=1, lr=1e-3)
    assert bf16[0] == pytest.approx(base[0], abs=2e-2)
