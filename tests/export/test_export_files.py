"""`harness export`: each stack's file says every setting of the plan, or why it cannot
(not_expressed, with the nearest equivalent); a plan with nothing a stack can hold is a
one-line refusal (exit 2, no file). These tests read the files as text, JSON, YAML or
TOML; test_export_loads.py reads them with each stack's own library."""

from __future__ import annotations

import json
import tomllib

import pytest
import yaml

from tests.export import plans
from training_harness.cli.main import main
from training_harness.core.errors import HarnessError
from training_harness.export import STACKS, export_plan
from training_harness.strategies import registry

# A layout each strategy can stand in (the data-parallel ones need two ranks, ...).
NEEDS = {"ddp": {"data": 2}, "zero": {"data": 2}, "pipeline": {"pipeline": 2},
         "tensor": {"tensor": 2}}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", sorted(s.name for s in registry.all_strategies()))
def test_no_strategy_is_dropped_silently(stack, name):
    """Every registered strategy, alone in a plan, is carried or named in not_expressed
    (Writer.finish refuses an exporter that passes over one)."""
    layout = NEEDS.get(name, {})
    data = layout.get("data", 1)
    p = plans.plan({name: {}}, data=data, gb=2 * data).replace(layout=plans.Plan.from_dict(
        {"layout": layout}).layout)
    try:
        exp = export_plan(p, stack, "test")
    except HarnessError as e:  # nothing carried: the refusal names what was lost
        assert name in str(e) and "nothing of this plan" in str(e)
        return
    lost = [n.setting for n in exp.not_expressed]
    assert name in exp.carried or any(s.startswith(name) for s in lost), (exp.carried, lost)
    # beside the file, in its sidecar; a YAML / TOML file says them in comments too
    assert [n["setting"] for n in json.loads(exp.sidecar())["not_expressed"]] == lost
    if exp.suffix == ".json":  # the file holds the stack's own keys only
        assert "not_expressed" not in json.loads(exp.text)
    else:  # a comment line each
        assert all(f"#   - {n.line()}" in exp.text for n in exp.not_expressed)


def test_hf_trainer_fields_of_the_best():
    exp = export_plan(plans.single(), "hf-trainer", "test")
    args = json.loads(exp.text)
    assert args["per_device_train_batch_size"] == 2
    assert args["gradient_accumulation_steps"] == 2
    assert args["bf16"] is True and "fp16" not in args
    assert args["optim"] == "adamw_torch_fused"
    assert args["activation_checkpointing"] is True
    assert "harness" not in args and "not_expressed" not in args  # the sidecar's
    notes = json.loads(exp.sidecar())
    assert notes["harness"]["model_kwargs"] == {"attn_implementation": "sdpa"}
    assert notes["not_expressed"] == []  # all of it is TrainingArguments' own


def test_hf_trainer_names_what_it_cannot_run():
    p = plans.plan({"lamb": {}, "checkpoint": {"every": 2, "policy": "selective"}})
    exp = export_plan(p, "hf-trainer", "test")
    lost = {n.setting: n for n in exp.not_expressed}
    assert not lost["lamb"].applied  # no LAMB in the Trainer: the file lacks it
    assert lost["checkpoint.every = 2"].applied  # the nearest (every layer) is written
    assert "every layer" in lost["checkpoint.every = 2"].nearest
    assert [n.setting for n in exp.missing()] == ["lamb"]
    assert json.loads(exp.sidecar())["not_expressed"][0]["setting"] in lost


def test_sharded_layouts():
    args = json.loads(export_plan(plans.zero(2), "hf-trainer", "test").text)
    assert args["fsdp"] is True
    assert args["fsdp_config"] == {"version": 2, "reshard_after_forward": False,
                                   "cpu_offload": False, "activation_checkpointing": True}
    assert "activation_checkpointing" not in args  # FSDP wraps the layers in their checkpoint
    args = json.loads(export_plan(plans.zero(3, offload=True), "hf-trainer", "test").text)
    assert args["fsdp_config"]["reshard_after_forward"] is True
    assert args["fsdp_config"]["cpu_offload"] is True
    acc = yaml.safe_load(export_plan(plans.zero(2), "accelerate", "test").text)
    assert acc["distributed_type"] == "FSDP" and acc["num_processes"] == 2
    assert acc["fsdp_config"]["fsdp_reshard_after_forward"] is False
    titan = tomllib.loads(export_plan(plans.zero(3), "torchtitan", "test").text)
    assert titan["parallelism"]["data_parallel_shard_degree"] == 2
    assert titan["parallelism"]["fsdp_reshard_after_forward"] == "always"
    ds = json.loads(export_plan(plans.zero(3, offload=True), "deepspeed", "test").text)
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_param"] == {"device": "cpu"}


def test_torchtitan_checkpointing_every_kth_layer():
    """Every 2nd block whole is torchtitan's layer-selective AC; op-level is 'op'."""
    t = tomllib.loads(export_plan(plans.plan({"checkpoint": {"every": 2}}), "torchtitan",
                                  "t").text)
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    t = tomllib.loads(export_plan(plans.plan({"checkpoint": {"policy": "selective"}}),
                                  "torchtitan", "t").text)
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_yaml_and_toml_carry_not_expressed_as_comments():
    exp = export_plan(plans.plan({"lamb": {}, "amp": {"dtype": "bf16"}}), "accelerate", "t")
    head = [line for line in exp.text.splitlines() if line.startswith("#   - ")]
    assert any(line.startswith("#   - lamb:") for line in head)
    assert any("micro_batch_size = 2" in line for line in head)


def test_cli_writes_beside_the_plan_and_lists_what_is_lost(tmp_path, capsys):
    path = tmp_path / "best.toml"
    path.write_text(plans.plan({"lamb": {}, "amp": {"dtype": "bf16"}}).to_toml())
    assert main(["export", str(path), "--to", "hf-trainer"]) == 0
    out = capsys.readouterr().out
    written = tmp_path / "best.hf-trainer.json"
    assert f"wrote {written}" in out and "lamb:" in out
    assert json.loads(written.read_text())["bf16"] is True
    assert main(["export", str(tmp_path), "--to", "deepspeed", "--out",
                 str(tmp_path / "ds.json")]) == 0  # a run folder: its best.toml
    assert json.loads((tmp_path / "ds.json").read_text())["optimizer"]["type"] == "Lamb"


def test_nothing_expressible_is_exit_2_in_one_line(tmp_path, capsys):
    """accelerate's config holds neither a micro-batch nor LAMB: nothing of this plan."""
    path = tmp_path / "plan.toml"
    path.write_text(plans.plan({"lamb": {}}, gb=None).to_toml())
    assert main(["export", str(path), "--to", "accelerate"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing of this plan" in err and "lamb" in err
    assert list(tmp_path.iterdir()) == [path]


def test_a_missing_source_is_exit_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--to", "deepspeed"]) == 2
    assert main(["export", str(tmp_path), "--to", "deepspeed"]) == 2  # no best.toml
    assert "no best.toml" in capsys.readouterr().err


@pytest.mark.parametrize("stack", STACKS)
def test_how_it_was_measured_is_named_not_dropped(stack):
    """A study's plan carries its memory cap and, on a GPU, expandable segments: neither is
    a stack's setting, so each file names them (and they do not stop a verify)."""
    p = plans.plan(plans.BEST, device="auto", memory_budget_bytes=2**30)
    exp = export_plan(p, stack, "t")
    named = {n.setting: n for n in exp.not_expressed}
    assert named[f"memory_budget_bytes = {2**30}"].applied
    assert named["expandable_segments = true"].applied
    assert "expandable_segments:True" in named["expandable_segments = true"].nearest


@pytest.mark.parametrize("stack", STACKS)
def test_each_part_of_fused_is_said(stack):
    """fused is several settings: the attention, the optimizer, the kernels; each is in
    the file or named (torchtitan's models use SDPA already)."""
    p = plans.plan({"amp": {"dtype": "bf16"},
                    "fused": {"attention": "sdpa", "optimizer": "fused", "layernorm": "triton"}})
    exp = export_plan(p, stack, "t")
    text = exp.text + exp.sidecar()  # the file, or its notes beside it
    assert "sdpa" in text or stack == "torchtitan"
    assert "fused" in text
    assert "triton" in text or "liger" in text


@pytest.mark.parametrize("stack", STACKS)
def test_fused_with_every_part_off_is_still_accounted_for(stack):
    p = plans.plan({"amp": {"dtype": "bf16"},
                    "fused": {"attention": "explicit", "optimizer": "default"}})
    exp = export_plan(p, stack, "t")  # Writer.finish would refuse a fused passed over
    assert "fused" in exp.carried or any(n.setting.startswith("fused")
                                          for n in exp.not_expressed)


@pytest.mark.parametrize("stack", STACKS)
def test_the_implementation_of_lamb_is_named(stack):
    """fused.optimizer picks LAMB's implementation when LAMB replaces AdamW: named, and
    never said as AdamW's."""
    p = plans.plan({"amp": {"dtype": "bf16"}, "lamb": {}, "fused": {"optimizer": "foreach"}})
    exp = export_plan(p, stack, "t")
    settings = [n.setting for n in exp.not_expressed]
    assert "fused.optimizer = foreach (of lamb)" in settings
    assert "AdamW(..., foreach" not in exp.text and "fused.optimizer = foreach" not in [
        s.split(" (")[0] for s in settings if "(of" not in s]
