"""`--to accelerate`: the `accelerate launch --config_file` YAML.

Use it as `accelerate launch --config_file FILE your_train.py`. It holds the processes,
mixed precision, the FSDP2 or DeepSpeed plugin and dynamo. What accelerate's config does
not hold (the micro-batch, the accumulation, the optimizer) lives in the user's script:
each such setting is a comment saying which line of the script takes it.
"""

from __future__ import annotations

from typing import Any

import yaml

from training_harness.export.common import (
    ATTN_IMPL,
    Export,
    Facts,
    Writer,
    comment_lines,
    optimizer_name,
    powersgd,
    triton_kernels,
)


def _script(w: Writer) -> None:
    """What the script's own lines say: micro-batch, accumulation, optimizer, attention."""
    f = w.facts
    w.lose(f"micro_batch_size = {f.mb}", "accelerate's config holds no batch size",
           f"DataLoader(dataset, batch_size={f.mb}) in your script")
    if f.accumulation > 1 and not f.get("zero"):
        w.lose(f"accumulation = {f.accumulation}", "accelerate's config holds no "
               "accumulation (its DeepSpeed plugin's does)",
               f"Accelerator(gradient_accumulation_steps={f.accumulation}) and "
               "`with accelerator.accumulate(model):` around each micro-step")
    opt = optimizer_name(f)
    if opt != "adamw":
        w.lose(opt, "an optimizer is built in your script", f"the harness's {opt} in your "
               "script, prepared by accelerator.prepare")
    fused = f.get("fused")
    if fused:
        if fused["optimizer"] in ("fused", "foreach") and opt == "adamw":
            w.lose(f"fused.optimizer = {fused['optimizer']}", "an optimizer is built in your "
                   "script", f"torch.optim.AdamW(..., {fused['optimizer']}=True)")
        if fused["attention"] in ATTN_IMPL:
            w.lose(f"fused.attention = {fused['attention']}", "the attention is chosen where "
                   "the model is built", "from_pretrained(..., attn_implementation="
                   f"'{ATTN_IMPL[fused['attention']]}')")
        if fused.get("sdpa_backend", "auto") != "auto":
            w.lose(f"fused.sdpa_backend = {fused['sdpa_backend']}", "accelerate has no "
                   "attention-kernel setting", "torch.nn.attention.sdpa_kernel(SDPBackend...) "
                   "around each step in your script")
        triton = triton_kernels(fused)
        if triton:
            w.lose(f"fused.{'/'.join(triton)} = triton", "accelerate swaps no kernels",
                   "liger_kernel.transformers.apply_liger_kernel_to_<model>() in your script")
        if fused.get("linear_cross_entropy"):
            w.lose("fused.linear_cross_entropy = true", "accelerate swaps no kernels",
                   "Liger's fused linear cross-entropy: liger_kernel.transformers."
                   "apply_liger_kernel_to_<model>(fused_linear_cross_entropy=True) in your "
                   "script")
    ckpt = f.get("checkpoint")
    if ckpt and "checkpoint" not in w.carried:
        w.lose(f"checkpoint.every = {ckpt['every']}", "accelerate's config checkpoints only "
               "under FSDP", "model.gradient_checkpointing_enable() in your script")
    w.lose_rest(_NEAREST, "accelerate's config has no such setting")


_NEAREST = {
    "pipeline": "torchtitan's pipeline schedules (--to torchtitan)",
    "tensor": "ParallelismConfig(tp_size=...) in Accelerator(...), accelerate 1.10+",
    "lamb": "the harness's Lamb in your script", "lars": "the harness's LARS in your script",
    "muon": "torch.optim.Muon in your script",
    "averaging": "torch.optim.swa_utils.AveragedModel in your loop",
    "lora": "peft.get_peft_model(...) before accelerator.prepare",
    "curriculum": "a collate_fn truncating to the scheduled length",
    "distill": "a teacher's KL term in your loss",
    "accumulation": "Accelerator(gradient_accumulation_steps=...) (no_sync on all but the last)",
    "ddp": "DistributedDataParallelKwargs(bucket_cap_mb=...) in Accelerator(kwargs_handlers=)",
    "tf32": "torch.backends.cuda.matmul.allow_tf32 = True in your script",
    "channels_last": "model.to(memory_format=torch.channels_last) before accelerator.prepare",
    "liger": "liger_kernel.transformers.apply_liger_kernel_to_<model_type>(model=model, ...) "
             "before accelerator.prepare",
    "sparse_attention": "attn_implementation='flex_attention' with a sliding-window mask, or "
                        "a transformers AttentionInterface function of your own",
}


def _ddp(w: Writer) -> None:
    ddp = w.facts.get("ddp")
    if not ddp:
        return
    w.lose(f"ddp.bucket_cap_mb = {ddp['bucket_cap_mb']:g}", "accelerate's config file holds "
           "no DDP settings", "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
           f"bucket_cap_mb={ddp['bucket_cap_mb']:g}, gradient_as_bucket_view="
           f"{ddp['gradient_as_bucket_view']}, comm_hook=...)])")
    if ddp["compression"] == "powersgd":
        w.lose(powersgd(ddp), "accelerate's config file holds no DDP settings",
               "DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType"
               ".POWER_SGD, comm_state_option={'matrix_approximation_rank': "
               f"{ddp['powersgd_rank']}, 'start_powerSGD_iter': {ddp['start_powersgd_iter']}}})")


def _sharding(w: Writer, cfg: dict[str, Any]) -> None:
    f, zero = w.facts, w.facts.get("zero")
    if not zero:
        return
    w.carry("zero")
    if zero["stage"] == 1:
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"zero_stage": 1,
                                   "gradient_accumulation_steps": f.accumulation,
                                   "zero3_init_flag": False}
        w.carry("accumulation")
        return
    cfg["distributed_type"] = "FSDP"
    if not f.cuda:
        w.lose(f"zero.stage = {zero['stage']} on a CPU", "accelerate runs FSDP on "
               "accelerators only: on CPUs it falls back to DDP (MULTI_CPU)",
               "DDP, unsharded, which is what then runs", applied=True)
    ckpt = f.get("checkpoint")
    cfg["fsdp_config"] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": zero["stage"] == 3,
        "fsdp_offload_params": bool(zero["offload"]),
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_activation_checkpointing": bool(ckpt),
    }
    if ckpt:
        w.carry("checkpoint")
        if ckpt["every"] != 1 or ckpt["policy"] != "full":
            w.lose(f"checkpoint.every = {ckpt['every']}, policy = {ckpt['policy']}",
                   "FSDP's activation checkpointing wraps every layer whole",
                   "every layer, full", applied=True)
    if f.accumulation > 1:
        w.lose(f"accumulation = {f.accumulation}", "accelerate's FSDP config holds no "
               "accumulation", f"Accelerator(gradient_accumulation_steps={f.accumulation})")


def export(facts: Facts, source: str) -> Export:
    w = Writer("accelerate", facts)
    precision = facts.precision()
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO",
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": facts.world,
        "mixed_precision": precision or "no",
        "use_cpu": not facts.cuda,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
    }
    if facts.world > 1:
        cfg["distributed_type"] = "MULTI_GPU" if facts.cuda else "MULTI_CPU"
    if facts.get("ddp"):
        w.carry("ddp")  # the process count and MULTI_*; its knobs are in the script
    if facts.get("float8"):
        cfg["mixed_precision"] = "fp8"
        cfg["fp8_config"] = {"backend": "AO"}
        w.carry("float8")
        if precision:
            w.lose(f"amp.dtype = {precision} beside float8", "mixed_precision holds one value",
                   "fp8 (torchao's float8 linears; the rest in the model's dtype)",
                   applied=True)
    fused = facts.get("fused")
    if fused and fused["compile"]:
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR",
                                "dynamo_mode": fused["compile_mode"],
                                "dynamo_use_fullgraph": False, "dynamo_use_dynamic": False,
                                "dynamo_use_regional_compilation": True}  # per block, as here
        w.carry("fused")
    _sharding(w, cfg)
    _ddp(w)
    amp = facts.get("amp")
    if amp and amp["dtype"] == "fp16" and amp["init_scale"] != 2.0**16:
        w.lose(f"amp.init_scale = {amp['init_scale']:g}", "accelerate's config holds no loss "
               "scale", "Accelerator(kwargs_handlers=[GradScalerKwargs(init_scale=...)])")
    _script(w)
    if fused and not w.touched("fused"):
        w.lose("fused", "nothing of it changes the run here", "leave it out")
    body = yaml.safe_dump(cfg, sort_keys=False)
    return w.finish(comment_lines(w.lost, source, "accelerate launch") + body, ".yaml")
