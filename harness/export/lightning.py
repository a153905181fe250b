"""`--to lightning`: a LightningCLI config YAML (`trainer:` and its strategy).

Use it as `python your_cli.py fit --config FILE` with a `LightningCLI(YourModule,
YourData)` script, or read its `trainer:` table into `Trainer(**...)`. The micro-batch
is the DataModule's (a comment says so); compile and the optimizer are the
LightningModule's (`configure_model`, `configure_optimizers`).
"""

from __future__ import annotations

from typing import Any

import yaml

from training_harness.export.common import (
    ATTN_IMPL,
    Export,
    Facts,
    Writer,
    adam_impl,
    comment_lines,
    optimizer_name,
    powersgd,
    triton_kernels,
)

STRATEGIES = "lightning.pytorch.strategies"
PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", None: "32-true"}


def _strategy(w: Writer) -> Any:
    f = w.facts
    ddp, zero = f.get("ddp"), f.get("zero")
    if zero and zero["stage"] == 1:
        w.carry("zero")
        return {"class_path": f"{STRATEGIES}.DeepSpeedStrategy", "init_args": {"stage": 1}}
    if zero:
        w.carry("zero")
        w.lose(f"zero.stage = {zero['stage']} (FSDP2)", "Lightning's FSDPStrategy is FSDP1 "
               "(flat parameters); FSDP2 is its ModelParallelStrategy with your own "
               "configure_model", "FSDPStrategy with the same sharding", applied=True)
        args: dict[str, Any] = {
            "sharding_strategy": "FULL_SHARD" if zero["stage"] == 3 else "SHARD_GRAD_OP",
            "cpu_offload": bool(zero["offload"]),
        }
        if f.get("checkpoint"):  # a set of layer classes: not a value YAML can name
            w.lose("checkpoint", "activation_checkpointing_policy takes your model's layer "
                   "classes", "FSDPStrategy(activation_checkpointing_policy={YourLayer})")
        return {"class_path": f"{STRATEGIES}.FSDPStrategy", "init_args": args}
    if ddp:
        w.carry("ddp")
        if ddp["compression"] == "powersgd":
            w.lose(powersgd(ddp), "a communication hook and its state are objects, not YAML "
                   "values", "DDPStrategy(ddp_comm_state="
                   "powerSGD_hook.PowerSGDState(None, matrix_approximation_rank="
                   f"{ddp['powersgd_rank']}, start_powerSGD_iter={ddp['start_powersgd_iter']}), "
                   "ddp_comm_hook=powerSGD_hook.powerSGD_hook) in code")
        elif ddp["compression"] != "none":
            w.lose(f"ddp.compression = {ddp['compression']}", "a communication hook is a "
                   "function, not a YAML value", "DDPStrategy(ddp_comm_hook="
                   f"default_hooks.{ddp['compression']}_compress_hook) in code")
        return {"class_path": f"{STRATEGIES}.DDPStrategy",
                "init_args": {"bucket_cap_mb": ddp["bucket_cap_mb"],
                              "gradient_as_bucket_view": ddp["gradient_as_bucket_view"]}}
    return "auto"


_NEAREST = {
    "pipeline": "torchtitan's pipeline schedules (--to torchtitan); Lightning has none",
    "tensor": "ModelParallelStrategy(tensor_parallel_size=...) with your configure_model",
    "fused": "the LightningModule's own code",
    "lamb": "the harness's Lamb in configure_optimizers",
    "lars": "the harness's LARS in configure_optimizers",
    "muon": "torch.optim.Muon in configure_optimizers",
    "averaging": "callbacks: WeightAveraging / StochasticWeightAveraging",
    "lora": "peft.get_peft_model(...) in configure_model",
    "curriculum": "a DataModule whose collate_fn truncates to the scheduled length",
    "distill": "a teacher's KL term in training_step",
    "float8": "torchao's convert_to_float8_training in configure_model",
    "checkpoint": "model.gradient_checkpointing_enable() in configure_model",
    "tf32": "torch.set_float32_matmul_precision('high') before Trainer.fit",
    "channels_last": "model.to(memory_format=torch.channels_last) in configure_model",
    "liger": "liger_kernel.transformers.apply_liger_kernel_to_<model_type>(model=...) in "
             "configure_model",
    "sparse_attention": "flex_attention with a sliding-window BlockMask in your model",
}


def export(facts: Facts, source: str) -> Export:
    w = Writer("lightning", facts)
    trainer: dict[str, Any] = {
        "accelerator": "gpu" if facts.cuda else "cpu",
        "devices": facts.world,
        "num_nodes": 1,
        "precision": PRECISION[facts.precision()],
        "accumulate_grad_batches": facts.accumulation,
        "strategy": _strategy(w),
    }
    if facts.get("accumulation") or facts.accumulation > 1:
        w.carry("accumulation")
    if facts.get("lamb") and facts.get("lamb")["max_grad_norm"]:
        trainer["gradient_clip_val"] = facts.get("lamb")["max_grad_norm"]
    w.lose(f"micro_batch_size = {facts.mb}", "the batch size belongs to your DataModule",
           f"data: init_args: batch_size: {facts.mb} (your DataModule's argument)")
    fused = facts.get("fused")
    if fused and optimizer_name(facts) == "adamw" and adam_impl(facts) in ("fused", "foreach"):
        w.lose(f"fused.optimizer = {fused['optimizer']}", "configure_optimizers builds it",
               f"torch.optim.AdamW(..., {fused['optimizer']}=True)")
    if fused and fused["compile"]:
        w.lose("fused.compile = true", "the LightningModule compiles itself",
               "torch.compile each block in configure_model")
    if fused and fused["attention"] in ATTN_IMPL:
        w.lose(f"fused.attention = {fused['attention']}", "the attention is chosen where the "
               "model is built", "from_pretrained(..., attn_implementation="
               f"'{ATTN_IMPL[fused['attention']]}') in configure_model")
    if fused and fused.get("sdpa_backend", "auto") != "auto":
        w.lose(f"fused.sdpa_backend = {fused['sdpa_backend']}", "Lightning has no "
               "attention-kernel setting", "torch.nn.attention.sdpa_kernel(SDPBackend...) "
               "in training_step")
    triton = triton_kernels(fused) if fused else []
    if triton:
        w.lose(f"fused.{'/'.join(triton)} = triton", "Lightning swaps no kernels",
               "liger_kernel's apply_liger_kernel_to_<model>() in configure_model")
    if fused and fused.get("linear_cross_entropy"):
        w.lose("fused.linear_cross_entropy = true", "Lightning swaps no kernels",
               "Liger's fused linear cross-entropy: apply_liger_kernel_to_<model>("
               "fused_linear_cross_entropy=True) in configure_model, or "
               "LigerFusedLinearCrossEntropyLoss in training_step")
    w.lose_rest(_NEAREST, "Lightning's Trainer has no such setting")
    body = yaml.safe_dump({"seed_everything": facts.plan.seed, "trainer": trainer},
                          sort_keys=False)
    return w.finish(comment_lines(w.lost, source, "Lightning (LightningCLI)") + body, ".yaml")
