"""Each stack's export read by the stack's own library, the way its users read it:
HfArgumentParser(TrainingArguments), accelerate's config loader, LightningCLI's parser
(and its Trainer where the strategy runs on a CPU), torchtitan 0.2.1's ConfigManager,
DeepSpeed's DeepSpeedConfig. The [export] extra installs them; a missing one skips
its test, saying which."""

from __future__ import annotations

import json

import pytest

from tests.export import plans
from training_harness.export import export_plan
from training_harness.export.common import sidecar_path

pytestmark = pytest.mark.slow  # each imports a large library (seconds on a busy CPU)

PLANS = {"single": plans.single, "ddp": plans.ddp, "zero1": lambda: plans.zero(1),
         "zero2": lambda: plans.zero(2), "zero3-offload": lambda: plans.zero(3, True)}


def write(tmp_path, name: str, stack: str):
    exp = export_plan(PLANS[name](), stack, "test")
    path = tmp_path / f"{name}.{stack}{exp.suffix}"
    path.write_text(exp.text)
    sidecar_path(path).write_text(exp.sidecar())
    return path


@pytest.mark.parametrize("name", ["single", "ddp", "zero2", "zero3-offload"])
def test_hf_trainer_json_in_hf_argument_parser(tmp_path, name):
    import training_harness  # noqa: F401  (torchvision's mend before transformers)

    tf = pytest.importorskip("transformers")
    # as HF's example scripts (run_clm.py) read it: the parser's defaults, no extra key
    (args,) = tf.HfArgumentParser(tf.TrainingArguments).parse_json_file(
        write(tmp_path, name, "hf-trainer"))
    p = PLANS[name]()
    assert args.per_device_train_batch_size == p.micro_batch_size
    assert args.gradient_accumulation_steps == p.accumulation_steps
    assert args.bf16 and args.use_cpu
    if name == "single":
        assert args.optim == "adamw_torch_fused" and args.activation_checkpointing
    if name == "ddp":
        assert args.ddp_bucket_cap_mb == 25
    if name.startswith("zero"):
        assert args.fsdp and args.fsdp_config["activation_checkpointing"]
        plugin = args._process_fsdp_args() if hasattr(args, "_process_fsdp_args") else None
        if plugin is not None:  # what the Trainer hands accelerate's FSDP plugin
            assert plugin["fsdp_version"] == 2
            assert plugin["reshard_after_forward"] is (name != "zero2")
            assert plugin.get("cpu_offload", False) is (name == "zero3-offload")


@pytest.mark.parametrize("name", ["single", "ddp", "zero1", "zero2"])
def test_accelerate_yaml_in_its_config_loader(tmp_path, name):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(write(tmp_path, name, "accelerate")))
    assert cfg.mixed_precision == "bf16" and cfg.use_cpu
    kind = {"single": "NO", "ddp": "MULTI_CPU", "zero1": "DEEPSPEED", "zero2": "FSDP"}[name]
    assert str(cfg.distributed_type).endswith(kind)
    assert cfg.num_processes == PLANS[name]().world_size
    if name == "zero2":
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_reshard_after_forward"] is False
        assert cfg.fsdp_config["fsdp_activation_checkpointing"] is True
    if name == "zero1":
        assert cfg.deepspeed_config["zero_stage"] == 1


@pytest.mark.parametrize("name", ["single", "ddp", "zero1", "zero2"])
def test_lightning_yaml_in_lightning_cli(tmp_path, name):
    pytest.importorskip("lightning")
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringModel

    path = write(tmp_path, name, "lightning")
    p = PLANS[name]()
    if name == "zero2":  # Lightning's FSDP needs a GPU: the parser checks the file, and the
        # strategy is built from its init_args
        from lightning.pytorch import Trainer
        from lightning.pytorch.strategies import FSDPStrategy

        parser = LightningArgumentParser()
        parser.add_lightning_class_args(Trainer, "trainer")
        parser.add_argument("--seed_everything", type=int)  # LightningCLI's own key
        cfg = parser.parse_path(str(path))
        assert cfg.trainer.accumulate_grad_batches == p.accumulation_steps
        assert cfg.trainer.strategy.class_path.endswith("FSDPStrategy")
        strategy = FSDPStrategy(**dict(cfg.trainer.strategy.init_args))
        assert str(strategy.sharding_strategy).endswith("SHARD_GRAD_OP")
        return
    cli = LightningCLI(BoringModel, run=False, args=["--config", str(path)],
                       save_config_callback=None)
    trainer = cli.trainer
    assert trainer.accumulate_grad_batches == p.accumulation_steps
    assert trainer.precision == "bf16-mixed"
    assert trainer.num_devices == p.world_size
    want = {"single": "SingleDeviceStrategy", "ddp": "DDPStrategy", "zero1": "DeepSpeedStrategy"}
    assert type(trainer.strategy).__name__ == want[name]
    if name == "ddp":
        assert trainer.strategy._ddp_kwargs["bucket_cap_mb"] == 25.0


@pytest.mark.parametrize("name", ["single", "zero3-offload"])
def test_torchtitan_toml_in_its_config_manager(tmp_path, name):
    pytest.importorskip("torchtitan", reason="torchtitan 0.2.1 (the [export] extra)")
    from torchtitan.config import ConfigManager

    job = ConfigManager().parse_args(["--job.config_file", str(write(tmp_path, name,
                                                                     "torchtitan"))])
    p = PLANS[name]()
    assert job.training.local_batch_size == p.micro_batch_size
    assert job.training.global_batch_size == p.batch_size
    assert job.training.seq_len == 16
    assert job.training.mixed_precision_param == "bfloat16"
    if name == "single":
        assert job.activation_checkpoint.mode == "full"
        assert job.optimizer.implementation == "fused"
        assert job.parallelism.data_parallel_shard_degree == 1
    else:
        assert job.parallelism.data_parallel_shard_degree == 2
        assert job.parallelism.fsdp_reshard_after_forward == "always"
        assert job.training.enable_cpu_offload


@pytest.mark.parametrize("name", ["single", "ddp", "zero3-offload"])
def test_deepspeed_json_in_deepspeed_config(tmp_path, name):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    path = write(tmp_path, name, "deepspeed")
    cfg = DeepSpeedConfig(str(path))
    p = PLANS[name]()
    assert cfg.train_micro_batch_size_per_gpu == p.micro_batch_size
    assert cfg.gradient_accumulation_steps == p.accumulation_steps
    assert cfg.bfloat16_config.enabled
    stage = {"single": 0, "ddp": 0, "zero3-offload": 3}[name]
    assert cfg.zero_optimization_stage == stage
    if name == "zero3-offload":
        assert cfg.zero_config.offload_param is not None
    assert cfg.optimizer_name.lower() == "adamw"
    assert json.loads(sidecar_path(path).read_text())["not_expressed"] is not None
