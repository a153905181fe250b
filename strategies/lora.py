"""LoRA (Hu et al., 2021) through `peft` on `hf:` models: low-rank adapters beside the
chosen linear layers, and only the adapters train.

Each targeted linear W gets W x + (alpha / rank) x B A x, A (rank x in) random and B
(out x rank) zero, so training starts from the model's own outputs; every other
parameter is frozen (no gradient, no optimizer state). `peft.inject_adapter_in_model`
puts the adapters into the model in place (the model stays the transformers class, so
checkpointing finds its decoder layers, FSDP shards them, `--save` merges the adapters
into the weights). Empty `target_modules`: peft's default for the model type (Llama's
q_proj and v_proj, GPT-2's c_attn ...), else every linear but the output layer.

Composes with amp (autocast, and fp16's scaler), checkpointing (non-reentrant: frozen
inputs are fine), accumulation, DDP and ZeRO 1/2/3 (the optimizer and its shards hold
the adapters only; FSDP2 shards frozen and trainable parameters alike). Refused with
tensor parallel and the pipeline (their plans split or cut the linears the adapters
wrap) and beside float8 (it swaps those linears). Needs `pip install -e '.[peft]'`.

The model FLOPs stay 6N per token of the whole model, as for full fine-tuning, although
the frozen weights take no weight gradient (about 4N per token of it run); the notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class LoraSettings:
    rank: int = bounded(8, 1, 65536)
    alpha: float = bounded(16.0, 0.0, 1e6)  # the update is scaled by alpha / rank
    dropout: float = bounded(0.0, 0.0, 0.99)  # on the adapters' input
    # module names (or name suffixes) to adapt; empty: peft's default for the model type
    target_modules: list[str] = field(default_factory=list)


def peft_module():
    """peft, imported after transformers' torchvision mend (training_harness.workloads.optional)."""
    from training_harness.workloads import optional

    return optional.require("peft", "peft")


def inject(model, settings: LoraSettings) -> list[str]:
    """Put `settings`' adapters into `model` in place and freeze every other parameter;
    the names of the adapted layers. The estimator does the same on its meta-device
    model (training_harness.estimator.facts), so that only the adapters count as trainable."""
    peft = peft_module()
    targets = list(settings.target_modules) or None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    defaults = peft.utils.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    if targets is None and model_type not in defaults:
        targets = "all-linear"
    config = peft.LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                             lora_dropout=settings.dropout, target_modules=targets)
    try:
        peft.inject_adapter_in_model(config, model)
    except ValueError as e:
        raise HarnessError(f"lora: {e}; set target_modules to names of the model's "
                           "linear layers") from None
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")})


class Lora(Strategy):
    name = "lora"
    summary = ("LoRA adapters through peft on hf: models (rank, alpha, target modules): "
               "only the adapters train")
    phases = (Phase.MODULE_SWAP,)
    Settings = LoraSettings
    requires = "an hf: model and peft (pip install -e '.[peft]'); not with tensor parallel, " \
               "the pipeline or float8"

    def space(self):
        return {"rank": Choice((4, 8, 16, 32)), "alpha": Choice((8.0, 16.0, 32.0))}

    def check(self, settings, plan, env):
        reasons = []
        if not plan.workload.startswith("hf:"):
            reasons.append(f"lora: adapters through peft on hf: models only; "
                           f"'{plan.workload}' is not one")
        else:
            try:
                peft_module()
            except HarnessError as e:
                reasons.append(f"lora: {e}")
        if plan.layout.tensor > 1 or "tensor" in plan.strategies:
            reasons.append("lora: not with tensor parallel (its plan splits the linears that "
                           "peft's LoRA layers wrap); use data parallel or ZeRO")
        if plan.layout.pipeline > 1 or "pipeline" in plan.strategies:
            reasons.append("lora: not with the pipeline (its stages are cut from the "
                           "model's own layers, not peft's wrapped ones); use data parallel "
                           "or ZeRO")
        if "float8" in plan.strategies:
            reasons.append("lora: not with float8 (it swaps the linears the adapters wrap)")
        return reasons

    def apply(self, phase, setup, settings):
        model = setup.model
        adapted = inject(model, settings)
        total = sum(p.numel() for p in model.parameters())
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        setup.notes.append(
            f"lora: rank {settings.rank}, alpha {settings.alpha:g} on {', '.join(adapted)}; "
            f"{trained} of {total} parameters train ({100 * trained / total:.2g}%); model "
            "FLOPs count 6N per token of the whole model, as full fine-tuning (the frozen "
            "weights take no weight gradient)")


register(Lora())
