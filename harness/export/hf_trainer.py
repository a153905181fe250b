"""`--to hf-trainer`: Hugging Face TrainingArguments as JSON.

Every key is a TrainingArguments field, so HF's example scripts load it as they are:
`HfArgumentParser(TrainingArguments).parse_json_file(path)`. What belongs outside
TrainingArguments (the model's `from_pretrained` kwargs, the launch command) and each
setting the Trainer cannot take (with its reason and nearest equivalent) go in the
sidecar beside it (`<name>.harness.json`: Export.sidecar).
"""

from __future__ import annotations

import json
from typing import Any

from training_harness.export.common import (
    ATTN_IMPL,
    Export,
    Facts,
    Writer,
    adam_impl,
    optimizer_name,
    powersgd,
    triton_kernels,
)

SCALER_INIT = 2.0**16  # the Trainer's GradScaler (accelerate's) starts at torch's default


def _precision(w: Writer, args: dict[str, Any]) -> None:
    amp, tf32 = w.facts.get("amp"), w.facts.get("tf32")
    if amp:
        args["bf16" if amp["dtype"] == "bf16" else "fp16"] = True
        if amp["dtype"] == "fp16" and amp["init_scale"] != SCALER_INIT:
            w.lose(f"amp.init_scale = {amp['init_scale']:g}", "TrainingArguments has no loss "
                   "scale", f"the Trainer's GradScaler starts at {SCALER_INIT:g}", applied=True)
    if tf32:
        args["tf32"] = True
        w.carry("tf32")
        if tf32["matmul_precision"] != "high":
            w.lose(f"tf32.matmul_precision = {tf32['matmul_precision']}", "tf32 = true sets "
                   "the 'high' float32 matmul precision", "tf32 = true", applied=True)
        if not tf32["cudnn"]:
            w.lose("tf32.cudnn = false", "tf32 = true turns on cuDNN's TF32 too",
                   "tf32 = true", applied=True)


def _optimizer(w: Writer, args: dict[str, Any]) -> None:
    """AdamW's implementation (the fused strategy's optimizer), or the optimizer that
    replaces it, which the Trainer's `optim` list does not hold."""
    f, opt = w.facts, optimizer_name(w.facts)
    hp = f.plan.optimizer
    args.update(learning_rate=hp.lr, weight_decay=hp.weight_decay, adam_beta1=hp.betas[0],
                adam_beta2=hp.betas[1], adam_epsilon=hp.eps)
    if opt != "adamw":
        w.lose(opt, f"the Trainer's `optim` has no {opt.upper()}", "optim = 'adamw_torch_fused'"
               f" with this file, or pass your own: Trainer(optimizers=({opt} optimizer, None))")
        args["optim"] = "adamw_torch"
        return
    impl = adam_impl(f)
    args["optim"] = "adamw_torch_fused" if impl in ("fused", "triton") else "adamw_torch"
    if impl == "triton":
        w.lose("fused.optimizer = triton", "the harness's Triton AdamW has no Trainer name",
               "optim = 'adamw_torch_fused'", applied=True)
    elif impl == "foreach" and not f.cuda:
        w.lose("fused.optimizer = foreach", "adamw_torch takes torch's default implementation"
               " (the for-loop on a CPU; foreach on CUDA)", "optim = 'adamw_torch'",
               applied=True)


def _fused(w: Writer, args: dict[str, Any], model_kwargs: dict[str, Any]) -> None:
    f = w.facts.get("fused")
    hf = w.facts.plan.workload.startswith("hf:")
    attention = (f or {}).get("attention")
    if hf:  # the model's attention is chosen where it is built, not in TrainingArguments
        chosen = ATTN_IMPL.get(attention) or (
            "eager" if attention else w.facts.plan.workload_args.get("attn_implementation",
                                                                     "eager"))
        model_kwargs["attn_implementation"] = chosen
    if not f:
        return
    w.carry("fused")
    if attention in ATTN_IMPL and not hf:
        w.lose(f"fused.attention = {attention}", "the harness's own model switches its "
               "attention", "call F.scaled_dot_product_attention (or flex_attention) in your "
               "model's attention")
    if f.get("sdpa_backend", "auto") != "auto":
        w.lose(f"fused.sdpa_backend = {f['sdpa_backend']}", "TrainingArguments has no "
               "attention-kernel setting", "a Trainer subclass whose training_step runs under "
               "torch.nn.attention.sdpa_kernel(SDPBackend...)")
    if f["compile"]:
        args["torch_compile"] = True
        args["torch_compile_mode"] = f["compile_mode"]
        w.lose("fused.compile = true", "the harness compiles each block; the Trainer "
               "compiles the whole model", "torch_compile = true", applied=True)
    triton = triton_kernels(f)
    if triton:
        args["use_liger_kernel"] = True
        w.lose(", ".join(f"fused.{k} = {f[k]}" for k in triton), "the harness's Triton "
               "kernels have no Trainer switch", "use_liger_kernel = true (Liger's RMSNorm, "
               "SwiGLU and fused linear cross-entropy)", applied=True)
    if f.get("linear_cross_entropy"):
        args["use_liger_kernel"] = True
        w.lose("fused.linear_cross_entropy = true", "the harness's fused linear "
               "cross-entropy has no Trainer switch", "use_liger_kernel = true (Liger's fused "
               "linear cross-entropy, for the model types Liger patches)", applied=True)


def _liger(w: Writer, args: dict[str, Any]) -> None:
    """The liger strategy is the Trainer's own switch, with its patches as Liger's kwargs."""
    liger = w.facts.get("liger")
    if not liger:
        return
    args["use_liger_kernel"] = True
    args["liger_kernel_config"] = dict(liger)  # Liger's own argument names
    w.carry("liger")


def _checkpoint(w: Writer, args: dict[str, Any], fsdp: bool) -> None:
    c = w.facts.get("checkpoint")
    if not c:
        return
    w.carry("checkpoint")
    if fsdp:  # FSDP wraps each layer in its checkpoint (transformers' advice)
        args["fsdp_config"]["activation_checkpointing"] = True
    else:
        args["activation_checkpointing"] = True  # transformers 5: gradient_checkpointing's name
        args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if c["every"] != 1:
        w.lose(f"checkpoint.every = {c['every']}", "the Trainer checkpoints every layer",
               "every layer (more recompute, less memory)", applied=True)
    if c["policy"] != "full":
        w.lose("checkpoint.policy = selective", "the Trainer recomputes whole layers",
               "full checkpointing of each layer", applied=True)


def _parallel(w: Writer, args: dict[str, Any], harness: dict[str, Any]) -> bool:
    """Data parallel (DDP or ZeRO), and the layouts the Trainer cannot run. True with FSDP."""
    f = w.facts
    layout = f.plan.layout
    if f.world > 1:
        harness["launch"] = f"torchrun --nproc-per-node {f.world} your_train.py"
    for name in ("pipeline", "tensor"):
        if f.get(name):
            nearest = ("a torchtitan or DeepSpeed pipeline (--to torchtitan)" if name ==
                       "pipeline" else "from_pretrained(tp_plan='auto') under torchrun, "
                       "outside the Trainer; or --to torchtitan")
            w.lose(name, f"the Trainer has no {name} parallelism ({getattr(layout, name)} "
                   "ranks)", nearest)
    ddp, zero = f.get("ddp"), f.get("zero")
    if ddp:
        w.carry("ddp")
        args["ddp_bucket_cap_mb"] = int(round(ddp["bucket_cap_mb"]))
        if ddp["bucket_cap_mb"] != args["ddp_bucket_cap_mb"]:
            w.lose(f"ddp.bucket_cap_mb = {ddp['bucket_cap_mb']}", "ddp_bucket_cap_mb is whole "
                   "megabytes", f"{args['ddp_bucket_cap_mb']}", applied=True)
        if ddp["compression"] == "powersgd":
            w.lose(powersgd(ddp), "the Trainer registers no communication hook",
                   "model.register_comm_hook(powerSGD_hook.PowerSGDState("
                   f"None, matrix_approximation_rank={ddp['powersgd_rank']}, start_powerSGD_iter="
                   f"{ddp['start_powersgd_iter']}), powerSGD_hook.powerSGD_hook) in a "
                   "callback's on_train_begin")
        elif ddp["compression"] != "none":
            w.lose(f"ddp.compression = {ddp['compression']}", "the Trainer registers no "
                   "communication hook", f"model.register_comm_hook(None, "
                   f"{ddp['compression']}_compress_hook) in a callback's on_train_begin")
        if ddp["gradient_as_bucket_view"]:
            w.lose("ddp.gradient_as_bucket_view = true", "the Trainer builds DDP without it",
                   "DDP's default (a copy of each bucket)", applied=True)
    if not zero:
        return False
    w.carry("zero")
    if zero["stage"] == 1:  # no ZeRO-1 in FSDP: DeepSpeed's stage 1
        args["deepspeed"] = {"zero_optimization": {"stage": 1},
                             "train_micro_batch_size_per_gpu": "auto",
                             "gradient_accumulation_steps": "auto",
                             "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
        return False
    # transformers 5's form: fsdp = true, the sharding in fsdp_config (FSDP2)
    args["fsdp"] = True
    args["fsdp_config"] = {"version": 2, "reshard_after_forward": zero["stage"] == 3,
                           "cpu_offload": bool(zero["offload"])}
    if not f.cuda:  # accelerate (1.15) enters FSDP from MULTI_GPU-like types only
        w.lose(f"zero.stage = {zero['stage']} on a CPU", "accelerate runs FSDP on "
               "accelerators only: on CPUs the Trainer falls back to DDP (MULTI_CPU)",
               "DDP, unsharded, which is what then runs", applied=True)
    if not zero["mixed_precision"] and f.precision():
        w.lose("zero.mixed_precision = false", "the Trainer's FSDP computes in the amp dtype",
               f"FSDP in {f.precision()}", applied=True)
    return True


def _rest(w: Writer) -> None:
    """Strategies the Trainer has no switch for; each with its nearest."""
    nearest = {
        "float8": "accelerate's mixed_precision = 'fp8' with torchao (--to accelerate)",
        "averaging": "a TrainerCallback that keeps torch.optim.swa_utils.AveragedModel",
        "lora": "peft.get_peft_model(model, LoraConfig(...)) before Trainer(model=...)",
        "curriculum": "a collate_fn that truncates each batch to the scheduled length",
        "distill": "a Trainer subclass whose compute_loss adds the teacher's KL term",
        "channels_last": "model.to(memory_format=torch.channels_last) before Trainer(model=...)",
        "sparse_attention": "attn_implementation='flex_attention' with a sliding-window mask, "
                            "or an AttentionInterface function of your own",
    }
    w.lose_rest(nearest, "TrainingArguments has no such setting")


def export(facts: Facts, source: str) -> Export:
    w = Writer("hf-trainer", facts)
    plan = facts.plan
    args: dict[str, Any] = {
        "output_dir": f"trainer_output/{plan.name}",
        "per_device_train_batch_size": facts.mb,
        "gradient_accumulation_steps": facts.accumulation,
        "seed": plan.seed,
        "lr_scheduler_type": "constant",  # the harness's step keeps its lr
        "max_grad_norm": 0.0,  # the harness clips only where LAMB says so
    }
    w.carry("micro_batch_size")
    if facts.accumulation > 1 or facts.get("accumulation"):
        w.carry("accumulation")
    if not facts.cuda:
        args["use_cpu"] = True
    acc = facts.get("accumulation")
    if acc and not acc["sync_last_only"]:
        args["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    harness: dict[str, Any] = {"source": source, "workload": plan.workload}
    model_kwargs: dict[str, Any] = {}
    _precision(w, args)
    _optimizer(w, args)
    fsdp = _parallel(w, args, harness)
    _checkpoint(w, args, fsdp)
    _fused(w, args, model_kwargs)
    _liger(w, args)
    _rest(w)
    if model_kwargs:
        harness["model_kwargs"] = model_kwargs
    return w.finish(json.dumps(args, indent=2) + "\n", ".json", harness)
