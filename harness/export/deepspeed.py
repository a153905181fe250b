"""`--to deepspeed`: a `ds_config.json` (deepspeed.initialize(config=...), or the
Trainer's `deepspeed` argument).

DeepSpeed reads the batch (micro-batch per GPU, accumulation, the global batch it
checks them against), bf16 or fp16 with its loss scaler, the ZeRO stage and offload,
the optimizer (AdamW or LAMB) and gradient compression. The keys DeepSpeed does not
have (`not_expressed`) are ignored by its config reader.
"""

from __future__ import annotations

import json
import math
from typing import Any

from training_harness.export.common import (
    Export,
    Facts,
    Writer,
    adam_impl,
    optimizer_name,
    powersgd,
)


def _precision(w: Writer, cfg: dict[str, Any]) -> None:
    amp = w.facts.get("amp")
    if not amp:
        return
    if amp["dtype"] == "bf16":
        cfg["bf16"] = {"enabled": True}
        return
    power = math.log2(amp["init_scale"])
    cfg["fp16"] = {"enabled": True, "loss_scale": 0,  # 0: dynamic, as torch's GradScaler
                   "initial_scale_power": round(power)}
    if power != round(power):
        w.lose(f"amp.init_scale = {amp['init_scale']:g}", "DeepSpeed's first scale is a "
               "power of 2", f"initial_scale_power = {round(power)}", applied=True)


def _zero(w: Writer, cfg: dict[str, Any]) -> None:
    f = w.facts
    zero, ddp = f.get("zero"), f.get("ddp")
    z: dict[str, Any] = {"stage": 0}
    if zero:
        w.carry("zero")
        z = {"stage": zero["stage"], "overlap_comm": True}
        if zero["offload"]:
            z["offload_param"] = {"device": "cpu"}
            z["offload_optimizer"] = {"device": "cpu"}
        if not zero["mixed_precision"] and f.precision():
            w.lose("zero.mixed_precision = false", "DeepSpeed keeps its parameters in the amp "
                   "dtype", f"{f.precision()} parameters, fp32 master weights", applied=True)
    if ddp:  # DeepSpeed's own data parallel (stage 0) in place of DDP
        w.carry("ddp")
        z["reduce_bucket_size"] = int(ddp["bucket_cap_mb"] * 2**20 / 4)  # elements, fp32
        if ddp["compression"] == "powersgd":
            w.lose(powersgd(ddp), "DeepSpeed has no PowerSGD",
                   "1-bit Adam (optimizer type OneBitAdam, freeze_step = "
                   f"{ddp['start_powersgd_iter']}: uncompressed Adam steps, then 1-bit "
                   "momentum with error feedback; another compressor, NCCL or MPI)")
        elif ddp["compression"] != "none":
            cfg["communication_data_type"] = ddp["compression"]
    cfg["zero_optimization"] = z


def _optimizer(w: Writer, cfg: dict[str, Any]) -> None:
    f, hp = w.facts, w.facts.plan.optimizer
    opt = optimizer_name(f)
    params = {"lr": hp.lr, "betas": list(hp.betas), "eps": hp.eps,
              "weight_decay": hp.weight_decay}
    if opt == "lamb":
        w.carry("lamb")
        cfg["optimizer"] = {"type": "Lamb", "params": params}
        clip = f.get("lamb")["max_grad_norm"]
        cfg["gradient_clipping"] = clip
        w.lose("lamb", "DeepSpeed's Lamb is its fused CUDA kernel (no CPU build)",
               "optimizer type 'Lamb'", applied=True)
        return
    if opt != "adamw":
        w.lose(opt, "DeepSpeed's optimizers are Adam(W), Lamb, OneBit*, Muon (stage 0-2 only) "
               "and the user's own", "pass your own optimizer to deepspeed.initialize")
        return
    impl = adam_impl(f)
    # torch_adam: torch's AdamW (fused where the plan fused it); else DeepSpeed's FusedAdam
    cfg["optimizer"] = {"type": "AdamW", "params": {**params, "torch_adam": impl != "triton",
                                                     "adam_w_mode": True}}
    if impl == "triton":
        w.lose("fused.optimizer = triton", "the harness's Triton AdamW has no DeepSpeed name",
               "DeepSpeed's FusedAdam (torch_adam = false)", applied=True)
    elif impl in ("fused", "foreach"):
        w.lose(f"fused.optimizer = {impl}", "DeepSpeed builds torch's AdamW with its "
               "defaults", "torch_adam = true", applied=True)


def export(facts: Facts, source: str) -> Export:
    w = Writer("deepspeed", facts)
    cfg: dict[str, Any] = {
        # train_batch_size left out: DeepSpeed derives it (micro x accumulation x world), so
        # the file reads the same at any world size
        "train_micro_batch_size_per_gpu": facts.mb,
        "gradient_accumulation_steps": facts.accumulation,
        "gradient_clipping": 0.0,  # the harness clips only where LAMB says so
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    w.carry("micro_batch_size")
    if facts.get("accumulation") or facts.accumulation > 1:
        w.carry("accumulation")
        acc = facts.get("accumulation")
        if acc and not acc["sync_last_only"]:
            w.lose("accumulation.sync_last_only = false", "DeepSpeed reduces gradients at "
                   "the accumulation boundary only", "sync at the last micro-step",
                   applied=True)
    _precision(w, cfg)
    _zero(w, cfg)
    _optimizer(w, cfg)
    fused = facts.get("fused") or {}  # its parts besides the optimizer (_optimizer's)
    parts = [f"fused.{k} = {v}" for k, v in fused.items()
             if k not in ("optimizer", "linear_cross_entropy")
             and v not in (False, "eager", "default", "explicit", "auto")]
    if fused.get("linear_cross_entropy"):
        w.lose("fused.linear_cross_entropy = true", "not a ds_config setting",
               "Liger's fused linear cross-entropy (apply_liger_kernel_to_<model>("
               "fused_linear_cross_entropy=True), or LigerFusedLinearCrossEntropyLoss "
               "in the model's forward)")
    if parts:
        w.lose(", ".join(parts), "not a ds_config setting", "the model's own attention and "
               "kernels; engine.compile() for torch.compile")
    elif fused and not w.touched("fused"):
        w.carry("fused")  # eager attention, torch's default AdamW: DeepSpeed's own
    w.lose_rest(_NEAREST, "not a ds_config setting")
    return w.finish(json.dumps(cfg, indent=2) + "\n", ".json")


_NEAREST = {
    "checkpoint": "model.gradient_checkpointing_enable() (transformers) or "
                  "deepspeed.checkpointing.checkpoint in the model's forward",
    "tf32": "torch.backends.cuda.matmul.allow_tf32 = True in your script",
    "pipeline": "deepspeed.pipe.PipelineModule(layers, num_stages=...) in code",
    "tensor": "tensor_parallel.autotp_size with deepspeed.tp_model_init (AutoTP)",
    "float8": "torchao's convert_to_float8_training before deepspeed.initialize",
    "averaging": "torch.optim.swa_utils.AveragedModel in your loop",
    "lora": "peft.get_peft_model(...) before deepspeed.initialize",
    "curriculum": "DeepSpeed's data_efficiency curriculum learning (seqlen metric)",
    "distill": "a teacher's KL term in your loss",
    "channels_last": "model.to(memory_format=torch.channels_last) before deepspeed.initialize",
    "liger": "liger_kernel.transformers.apply_liger_kernel_to_<model_type>(model=model, ...) "
             "before deepspeed.initialize",
    "sparse_attention": "ds_config's sparse_attention (mode 'bslongformer': sliding-window "
                        "and global blocks) with DeepSpeed's SparseSelfAttention in the model",
}
