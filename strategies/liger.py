"""Liger Kernel on `hf:` models: Liger's Triton RMSNorm, SwiGLU, RoPE and fused linear
cross-entropy for Llama-family models (the `liger-kernel` package, the [liger] extra).

Liger's own patch function for the model type (`apply_liger_kernel_to_llama` and its
siblings, looked up in Liger's table of supported types) is applied to the model
instance at the module-swap phase, with Liger's own argument names as the settings. It
binds Liger's forward to each RMSNorm and MLP instance (their class stays
transformers'), and replaces the module's rotary function and, for `cross_entropy`,
torch's `F.cross_entropy`: process-wide, as Liger does, which a trial's own processes
allow.

Supported: the types in Liger's table whose patch takes all four of rope, rms_norm,
swiglu and fused_linear_cross_entropy (llama, mistral, mixtral, qwen2, qwen3, phi3,
granite, olmo2 ...); Gemma's GeGLU, Nemotron and the vision models are refused.

Fused linear cross-entropy replaces the model's forward: given the labels, it computes
the loss from the last hidden state and the head's weight in chunks of tokens and never
makes the logits. Our loss is asked for it (`HFWorkload.loss(..., loss_in_forward=True)`
through `Setup.loss_override`): the labels, already shifted, go in as `shift_labels`,
and Liger's loss is the same mean over the positions whose label is not -100 (a mixture
of experts' router loss is added as without it). Evaluation (no labels) still reads
the logits.

Refused, each in one line: off CUDA (the kernels are Triton for GPUs; in Triton's
interpreter the RMSNorm and SwiGLU kernels fail, tests/test_liger.py), with tensor
parallel or the pipeline (Liger's forwards read whole weights and the whole model's
head), fused linear cross-entropy beside distillation (its loss needs the student's
logits) or beside the fused strategy's linear_cross_entropy (two fused heads), and
cross_entropy with fused_linear_cross_entropy (Liger's own rule). The fused strategy's
own Triton kernels swap nn.LayerNorm, the GPT's bias+GELU and nn.CrossEntropyLoss
modules, none of which these models have: beside them nothing is patched twice.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import asdict, dataclass

from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Phase, Strategy
from training_harness.strategies.registry import get, register

PATCHES = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")


@dataclass
class LigerSettings:
    """Liger's own argument names and defaults."""

    rope: bool = True
    rms_norm: bool = True
    swiglu: bool = True
    fused_linear_cross_entropy: bool = True  # the loss without the logits
    cross_entropy: bool = False  # Liger's cross-entropy on the logits (not with the above)


def liger_table() -> dict:
    """Liger's patch function by model type, or a HarnessError naming the extra."""
    from training_harness.workloads import optional

    optional.require("liger_kernel", "liger")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return MODEL_TYPE_TO_APPLY_LIGER_FN


def supported() -> dict:
    """The model types whose Liger patch takes rope, rms_norm, swiglu and fused linear
    cross-entropy: the Llama family."""
    return {t: fn for t, fn in liger_table().items()
            if set(PATCHES) <= set(inspect.signature(fn).parameters)}


@functools.lru_cache(maxsize=64)
def _model(workload: str, args_json: str) -> tuple[str, bool, int]:
    """(model type, causal LM, pretraining_tp) of an hf: workload, from its config."""
    from training_harness.workloads import load_workload

    w = load_workload(workload, json.loads(args_json))
    return (str(getattr(w.config, "model_type", "")), w.causal,
            int(getattr(w.config, "pretraining_tp", 1) or 1))


def _fused_lce(plan) -> bool:
    """Whether the plan's fused strategy computes its own linear cross-entropy."""
    if "fused" not in plan.strategies:
        return False
    fused = get("fused").parse(plan.strategies["fused"], "[strategies.fused]")
    return getattr(fused, "linear_cross_entropy", False) not in (False, None, "eager", "off")


class Liger(Strategy):
    name = "liger"
    summary = ("Liger Kernel's Triton RMSNorm, SwiGLU, RoPE and fused linear cross-entropy "
               "on hf: Llama-family models")
    phases = (Phase.MODULE_SWAP,)
    Settings = LigerSettings
    requires = ("liger-kernel (pip install 'training-harness[liger]'), a CUDA device, an hf: "
                "Llama-family causal LM; not with tensor parallel or the pipeline")

    def check(self, settings, plan, env):
        reasons = []
        if not any(asdict(settings).values()):
            reasons.append("liger: every patch is off; drop [strategies.liger]")
        if settings.cross_entropy and settings.fused_linear_cross_entropy:
            reasons.append("liger: cross_entropy and fused_linear_cross_entropy are two "
                           "losses (Liger takes one); set cross_entropy = false")
        if env.device_type != "cuda":
            reasons.append(f"liger: Liger's kernels are Triton for CUDA GPUs; "
                           f"{env.device_type} has none: drop [strategies.liger]")
        elif not env.triton:
            reasons.append("liger: Liger's kernels need Triton (pip install triton)")
        if plan.layout.tensor > 1 or "tensor" in plan.strategies:
            reasons.append("liger: not with tensor parallel (Liger's SwiGLU and loss read "
                           "whole weights, not DTensor shards); use data parallel or ZeRO")
        if plan.layout.pipeline > 1 or "pipeline" in plan.strategies:
            reasons.append("liger: not with the pipeline (Liger patches the whole model's "
                           "forward and head); use data parallel or ZeRO")
        if settings.fused_linear_cross_entropy:
            if "distill" in plan.strategies:
                reasons.append("liger: fused_linear_cross_entropy with distill: distillation's "
                               "loss needs the student's logits; set "
                               "fused_linear_cross_entropy = false")
            if _fused_lce(plan):
                reasons.append("liger: fused_linear_cross_entropy beside "
                               "fused.linear_cross_entropy: one fused head at a time; drop "
                               "one of them")
        reasons += self._model_reasons(settings, plan)
        return reasons

    def _model_reasons(self, settings, plan) -> list[str]:
        if not plan.workload.startswith("hf:"):
            return [f"liger: Liger patches Hugging Face models (hf:llama, hf:mistral, "
                    f"hf:qwen2 ...); '{plan.workload}' is not one: drop [strategies.liger]"]
        try:
            types = supported()
        except HarnessError as e:
            return [f"liger: {e}"]
        try:
            model_type, causal, tp = _model(
                plan.workload, json.dumps(plan.workload_args, sort_keys=True, default=str))
        except HarnessError:
            return []  # the workload's own check says what is wrong with it
        if model_type not in types:
            return [f"liger: Liger has no RoPE + RMSNorm + SwiGLU + fused linear "
                    f"cross-entropy patch for model type '{model_type}' (it has them for "
                    f"{', '.join(sorted(types))}): drop [strategies.liger]"]
        reasons = []
        if not causal:
            reasons.append(f"liger: '{plan.workload}' is not trained as a causal LM (Liger's "
                           "patches are the decoder's): drop [strategies.liger]")
        if tp > 1 and settings.fused_linear_cross_entropy:
            reasons.append(f"liger: pretraining_tp = {tp}, which Liger's fused linear "
                           "cross-entropy refuses: set fused_linear_cross_entropy = false")
        return reasons

    def apply(self, phase, setup, settings):
        model = setup.model
        model_type = model.config.model_type
        patch = supported().get(model_type)
        if patch is None:
            raise HarnessError(f"liger: no Liger patch for model type '{model_type}'")
        patch(model=model, cross_entropy=settings.cross_entropy,
              **{k: getattr(settings, k) for k in PATCHES})
        if settings.fused_linear_cross_entropy:
            # The model computes the loss from the labels (training_harness.workloads.hf).
            setup.loss_override = lambda loss_fn: functools.partial(loss_fn,
                                                                    loss_in_forward=True)
        on = [k for k, v in asdict(settings).items() if v]
        setup.notes.append(f"liger ({patch.__name__}): {', '.join(on)}"
                           + ("; the loss without the logits"
                              if settings.fused_linear_cross_entropy else ""))


register(Liger())
