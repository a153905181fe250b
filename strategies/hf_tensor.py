"""Tensor parallel for `hf:` workloads: the model's own `base_model_tp_plan`, else the
harness's plan (strategies.hf_tensor_plan), per layer.

transformers ships a plan for many decoders (Llama, Qwen2, Mistral ...):
{"layers.*.self_attn.q_proj": "colwise", ..., "layers.*.mlp.down_proj": "rowwise"}.
Its entries under the decoder layers are applied to each layer with torch's
ColwiseParallel / RowwiseParallel, as strategies.tensor does for the gpt: each rank
computes whole heads (the attention reshapes with -1 heads, so the local count
follows) and its slice of the MLP; embeddings, norms and the head stay replicated.
A model without one (BERT, OPT, DistilBERT ...) gets the harness's plan, read off its
layers by module name; where that cannot split the layers correctly (GPT-2's fused
Conv1D c_attn), or the model's plan has styles other than colwise / rowwise in its
layers, tensor parallel is refused with the reason.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from training_harness.core.errors import HarnessError
from training_harness.strategies import hf_tensor_plan
from training_harness.workloads.blocks import find_blocks
from training_harness.workloads.hf import HFWorkload

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
LAYER = "layers.*."


def model_plan(config, mlp: bool = True) -> dict[str, str] | None:
    """The per-layer entries of the model's own plan, relative to a decoder layer."""
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None
    return {k[len(LAYER):]: v for k, v in plan.items()
            if k.startswith(LAYER) and (mlp or not k[len(LAYER):].startswith("mlp."))}


def _head_reasons(config, ranks: int) -> list[str]:
    heads = {"num_attention_heads": getattr(config, "num_attention_heads", None),
             "num_key_value_heads": getattr(config, "num_key_value_heads", None)}
    return [f"tensor parallel over {ranks} ranks needs {name} ({n}) divisible by {ranks}: "
            "each rank computes whole heads"
            for name, n in heads.items() if type(n) is int and n % ranks]


def reasons(workload: HFWorkload, ranks: int, mlp: bool) -> list[str]:
    t, c = workload.source.model_type, workload.config
    plan = model_plan(c, mlp)
    if plan is None:
        return _own_plan_reasons(workload, ranks, mlp)
    odd = sorted({v for v in plan.values() if v not in STYLES})
    if odd:
        return [f"tensor parallel: '{t}''s base_model_tp_plan uses {', '.join(odd)}; only "
                "colwise and rowwise layers are applied here; leave tensor out"]
    out = _head_reasons(c, ranks)
    inner = getattr(c, "intermediate_size", None)
    splits_mlp = any(k.startswith("mlp.") for k in plan)  # a mixture's plan may leave it out
    if splits_mlp and inner is not None and inner % ranks:
        out.append(f"tensor parallel over {ranks} ranks needs intermediate_size ({inner}) "
                   f"divisible by {ranks}, or mlp = false")
    return out


def _own_plan_reasons(workload: HFWorkload, ranks: int, mlp: bool) -> list[str]:
    t = workload.source.model_type
    with torch.device("meta"):  # the layers' structure only, nothing allocated
        model = workload.build_model()
    blocks = find_blocks(model)
    if blocks is None:
        return [f"tensor parallel: transformers gives '{t}' no base_model_tp_plan and the "
                "harness finds no repeated layers in it to split; leave tensor out"]
    plan = hf_tensor_plan.plan_for(blocks)
    if plan.refused:
        return [f"tensor parallel: transformers gives '{t}' no base_model_tp_plan, and the "
                f"harness's own plan cannot split it: {plan.refused}; leave tensor out "
                "(layout tensor = 1)"]
    out = _head_reasons(workload.config, ranks)
    uneven = hf_tensor_plan.uneven(blocks[0], plan, ranks, mlp)
    if uneven:
        out.append(f"tensor parallel over {ranks} ranks needs the split sizes divisible by "
                   f"{ranks}: {', '.join(uneven)}" + ("; or mlp = false" if mlp else ""))
    return out


def apply(model: nn.Module, mesh, mlp: bool) -> str:
    """Split every layer of `model` over `mesh`; returns the note."""
    blocks = find_blocks(model)
    if blocks is None:
        raise HarnessError("tensor: the model has no layers to split")
    own = model_plan(model.config, mlp)
    plan = None if own is not None else hf_tensor_plan.plan_for(blocks)
    if plan is not None and plan.refused:
        raise HarnessError(f"tensor: {plan.refused}")
    styles = own if own is not None else plan.styles(mlp)
    per_layer = {name: STYLES[style]() for name, style in styles.items()}
    for layer in blocks:
        if plan is not None:
            hf_tensor_plan.localise_heads(layer, plan, mesh.size())
        parallelize_module(layer, mesh, per_layer)
    source = "transformers' base_model_tp_plan" if own is not None else "the harness's plan"
    # transformers >= 5.25 moved a mixture's experts out of the tensor plan into an
    # expert-parallel one (base_model_ep_plan), which this strategy does not apply
    whole = ("; the experts stay whole on every rank (the model's expert-parallel plan "
             "is not applied)" if getattr(model.config, "base_model_ep_plan", None) else "")
    return (f"tensor: {blocks.describe()} split over {mesh.size()} ranks by {source} "
            f"({len(per_layer)} linears a layer){whole}")
