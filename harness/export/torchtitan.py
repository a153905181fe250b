"""`--to torchtitan`: a job TOML in the schema of torchtitan 0.2.1 (torchtitan.config.JobConfig,
read by `torchrun ... -m torchtitan.train --job.config_file FILE`).

torchtitan 0.3 replaced the job TOML with Python config functions and `--section.key`
flags: the same sections and keys, given on its command line. torchtitan trains its own
model definitions (llama3, deepseek_v3, ...): a harness workload is named as its nearest
model, and the sizes are left to the user's flavor.
"""

from __future__ import annotations

from typing import Any

import tomli_w

from training_harness.export.common import (
    Export,
    Facts,
    Writer,
    adam_impl,
    comment_lines,
    optimizer_name,
    triton_kernels,
)

SCHEMA = "torchtitan 0.2.1 (torchtitan/config/job_config.py)"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
MODELS = {"hf:llama": "llama3", "gpt": "llama3", "hf:deepseek_v3": "deepseek_v3",
          "hf:qwen3": "qwen3"}


_NEAREST = {
    "averaging": "a custom trainer step", "lora": "peft on the model before parallelize",
    "curriculum": "a custom dataloader", "distill": "a custom loss (loss_fn)",
    "channels_last": "none: torchtitan's models have no convolutions",
    "liger": "[compile] enable = true, components = ['model', 'loss'] (Inductor fuses the "
             "norms, SwiGLU and loss)",
    "sparse_attention": "a sliding-window mask_mod for the model's FlexAttention "
                        "(use_flex_attn = True)",
}


def _parallelism(w: Writer, job: dict[str, Any]) -> None:
    f, layout = w.facts, w.facts.plan.layout
    par: dict[str, Any] = {"data_parallel_replicate_degree": 1,
                           "data_parallel_shard_degree": 1,
                           "tensor_parallel_degree": layout.tensor,
                           "pipeline_parallel_degree": layout.pipeline}
    ddp, zero = f.get("ddp"), f.get("zero")
    if ddp:
        par["data_parallel_replicate_degree"] = layout.data
        w.carry("ddp")
        w.lose(f"ddp.bucket_cap_mb = {ddp['bucket_cap_mb']:g}", "torchtitan's replicate "
               "(DDP) has no bucket setting", "its default buckets", applied=True)
        if ddp["compression"] != "none":  # powersgd too: none nearer
            w.lose(f"ddp.compression = {ddp['compression']}", "torchtitan registers no "
                   "communication hook", "uncompressed gradients", applied=True)
    if zero:
        w.carry("zero")
        par["data_parallel_shard_degree"] = layout.data
        par["fsdp_reshard_after_forward"] = "always" if zero["stage"] == 3 else "never"
        if zero["stage"] == 1:
            w.lose("zero.stage = 1", "torchtitan shards with FSDP2 only",
                   "FSDP without resharding after forward (ZeRO-2)", applied=True)
        if zero["offload"]:
            job["training"]["enable_cpu_offload"] = True
    tensor = f.get("tensor")
    if tensor:
        w.carry("tensor")
        if not tensor["mlp"]:
            w.lose("tensor.mlp = false", "torchtitan's plan splits attention and MLP alike",
                   "the MLP split too", applied=True)
    pipe = f.get("pipeline")
    if pipe:
        w.carry("pipeline")
        par["pipeline_parallel_schedule"] = SCHEDULES[pipe["schedule"]]
        micro = pipe["microbatches"] or f.accumulation
        per_micro, rest = divmod(f.mb * f.accumulation, micro)
        par["pipeline_parallel_microbatch_size"] = max(per_micro, 1)
        if rest:
            w.lose(f"pipeline.microbatches = {micro}", "torchtitan's micro-batches are whole "
                   "samples of the local batch", f"microbatch size {max(per_micro, 1)}",
                   applied=True)
        layers = f.plan.workload_args.get("num_hidden_layers") or f.plan.workload_args.get(
            "layers")
        stages = layout.pipeline * pipe["virtual_stages"]
        if pipe["virtual_stages"] > 1 and isinstance(layers, int) and layers % stages == 0:
            par["pipeline_parallel_layers_per_stage"] = layers // stages
    job["parallelism"] = par


def _checkpoint(w: Writer, job: dict[str, Any]) -> None:
    c = w.facts.get("checkpoint")
    if not c:
        job["activation_checkpoint"] = {"mode": "none"}
        return
    w.carry("checkpoint")
    if c["policy"] == "full":  # every k-th layer whole: torchtitan's layer-selective AC
        job["activation_checkpoint"] = ({"mode": "full"} if c["every"] == 1 else
                                        {"mode": "selective",
                                         "selective_ac_option": str(c["every"])})
        return
    job["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": "op"}
    if c["every"] != 1:
        w.lose(f"checkpoint.every = {c['every']} with policy selective", "torchtitan's "
               "op-level AC covers every layer", "op-level AC on every layer", applied=True)


def _fused(w: Writer, job: dict[str, Any]) -> None:
    f = w.facts.get("fused")
    if not f:
        return
    w.carry("fused")
    if f["compile"]:  # torchtitan compiles each transformer block, as the harness does
        job["compile"] = {"enable": True, "components": ["model"]}
        if f["compile_mode"] != "default":
            w.lose(f"fused.compile_mode = {f['compile_mode']}", "torchtitan's [compile] has "
                   "no mode", "mode 'default'", applied=True)
    triton = triton_kernels(f)
    if triton:
        w.lose(f"fused.{'/'.join(triton)} = triton", "torchtitan has no switch for the "
               "harness's Triton kernels", "compile (Inductor fuses them)", applied=False)
    if f.get("linear_cross_entropy"):
        w.lose("fused.linear_cross_entropy = true", "torchtitan's loss takes the whole "
               "logits", "none: a chunked loss needs the model's forward to return the "
               "hidden state, with a custom loss_fn on it", applied=False)
    if f["attention"] == "explicit":
        w.lose("fused.attention = explicit", "torchtitan's models use SDPA or flex attention",
               "SDPA", applied=True)
    if f["attention"] == "flex":
        w.lose("fused.attention = flex", "the job config does not choose the attention",
               "a model flavor with use_flex_attn = True")
    if f.get("sdpa_backend", "auto") != "auto":
        w.lose(f"fused.sdpa_backend = {f['sdpa_backend']}", "torchtitan has no "
               "attention-kernel setting", "torch.nn.attention.sdpa_kernel(SDPBackend...) in "
               "a custom_import module")


def _optimizer(w: Writer, job: dict[str, Any]) -> None:
    f, hp = w.facts, w.facts.plan.optimizer
    opt = optimizer_name(f)
    impl = adam_impl(f)
    chosen = {"fused": "fused", "foreach": "foreach", "triton": "fused"}.get(
        impl, "foreach" if f.cuda else "for-loop")  # "default": torch's own choice
    job["optimizer"] = {"name": "AdamW", "lr": hp.lr, "beta1": hp.betas[0],
                        "beta2": hp.betas[1], "eps": hp.eps, "weight_decay": hp.weight_decay,
                        "implementation": chosen}
    if impl == "triton" and opt == "adamw":
        w.lose("fused.optimizer = triton", "torchtitan's AdamW is torch's",
               "implementation = 'fused'", applied=True)
    if opt != "adamw":
        w.lose(opt, "torchtitan's optimizers are Adam and AdamW (and its own registry)",
               "register the harness's optimizer through torchtitan's OptimizersContainer")


def export(facts: Facts, source: str) -> Export:
    w = Writer("torchtitan", facts)
    plan = facts.plan
    seq_len = plan.workload_args.get("seq_len")
    job: dict[str, Any] = {
        "job": {"description": f"{plan.name}, exported by harness export from {source}"},
        "model": {"name": MODELS.get(plan.workload, "llama3"), "flavor": "debugmodel"},
        "training": {"local_batch_size": facts.mb, "global_batch_size": plan.batch_size,
                     "max_norm": 1e9,
                     "mixed_precision_param": "bfloat16" if facts.precision() == "bf16"
                     else "float32"},
        "lr_scheduler": {"warmup_steps": 0, "decay_ratio": 0.0},  # the harness's lr is constant
        "debug": {"seed": plan.seed},
    }
    if isinstance(seq_len, int):
        job["training"]["seq_len"] = seq_len
    w.carry("micro_batch_size")
    w.lose(f"workload = {plan.workload}", "torchtitan trains its own model definitions",
           f"model.name = '{job['model']['name']}' with a flavor of these sizes "
           f"({', '.join(f'{k}={v}' for k, v in plan.workload_args.items()) or 'defaults'})")
    w.lose("no gradient clipping", "torchtitan always clips at training.max_norm",
           "max_norm = 1e9 (never reached)", applied=True)
    if facts.precision() == "fp16":
        w.lose("amp.dtype = fp16", "torchtitan's mixed precision is bfloat16 or float32",
               "mixed_precision_param = 'bfloat16'")
    if facts.get("accumulation") or facts.accumulation > 1:
        w.carry("accumulation")  # global / (local x data-parallel degree), as here
    _parallelism(w, job)
    _checkpoint(w, job)
    _fused(w, job)
    _optimizer(w, job)
    f8 = facts.get("float8")
    if f8:
        w.carry("float8")
        job["model"]["converters"] = ["quantize.linear.float8"]
        job["quantize"] = {"linear": {"float8": {"recipe_name": f8["recipe"],
                                                 "emulate": f8["emulate"],
                                                 "filter_fqns": ["output"] if
                                                 f8["keep_first_last"] else []}}}
    if facts.get("tf32"):
        w.lose("tf32", "torchtitan has no TF32 switch",
               "torch.backends.cuda.matmul.allow_tf32 = True in a custom_import module")
    w.lose_rest(_NEAREST, "torchtitan's job config has no such section")
    body = tomli_w.dumps(job)
    head = comment_lines(w.lost, source, f"torchtitan job (schema: {SCHEMA})")
    return w.finish(head + body, ".toml")
