"""Tensor parallel for `hf:` workloads: the model's own `base_model_tp_plan`, per layer.

transformers ships a plan for many decoders (Llama, Qwen2, Mistral ...):
{"layers.*.self_attn.q_proj": "colwise", ..., "layers.*.mlp.down_proj": "rowwise"}.
Its entries under the decoder layers are applied to each layer with torch's
ColwiseParallel / RowwiseParallel, as strategies.tensor does for the gpt: each rank
computes whole heads (the attention reshapes with -1 heads, so the local count
follows) and its slice of the MLP; embeddings, norms and the head stay replicated.
A model without a plan (GPT-2, BERT), or with styles other than colwise / rowwise in
its layers, is refused with the reason.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from harness.core.errors import HarnessError
from harness.workloads.blocks import find_blocks
from harness.workloads.hf import HFWorkload

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
LAYER = "layers.*."


def layer_plan(workload: HFWorkload, mlp: bool = True) -> dict[str, str] | None:
    """The per-layer entries of the model's plan, relative to a decoder layer."""
    plan = getattr(workload.config, "base_model_tp_plan", None)
    if not plan:
        return None
    return {k[len(LAYER):]: v for k, v in plan.items()
            if k.startswith(LAYER) and (mlp or not k[len(LAYER):].startswith("mlp."))}


def reasons(workload: HFWorkload, ranks: int, mlp: bool) -> list[str]:
    t = workload.source.model_type
    plan = layer_plan(workload, mlp)
    if plan is None:
        return [f"tensor parallel: transformers gives '{t}' no base_model_tp_plan, so how to "
                "split its layers is not known; leave tensor out (layout tensor = 1)"]
    odd = sorted({v for v in plan.values() if v not in STYLES})
    if odd:
        return [f"tensor parallel: '{t}''s base_model_tp_plan uses {', '.join(odd)}; only "
                "colwise and rowwise layers are applied here; leave tensor out"]
    out = []
    c = workload.config
    heads = {"num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": getattr(c, "num_key_value_heads", None)}
    for name, n in heads.items():
        if n is not None and n % ranks:
            out.append(f"tensor parallel over {ranks} ranks needs {name} ({n}) divisible by "
                       f"{ranks}: each rank computes whole heads")
    inner = getattr(c, "intermediate_size", None)
    if mlp and inner is not None and inner % ranks:
        out.append(f"tensor parallel over {ranks} ranks needs intermediate_size ({inner}) "
                   f"divisible by {ranks}, or mlp = false")
    return out


def apply(model: nn.Module, workload_config, mesh, mlp: bool) -> str:
    """Split every decoder layer of `model` over `mesh`; returns the note."""
    plan = getattr(workload_config, "base_model_tp_plan", None) or {}
    per_layer = {k[len(LAYER):]: STYLES[v]() for k, v in plan.items()
                 if k.startswith(LAYER) and (mlp or not k[len(LAYER):].startswith("mlp."))}
    blocks = find_blocks(model)
    if blocks is None or not per_layer:
        raise HarnessError("tensor: the model has no decoder layers with a tensor-parallel plan")
    for layer in blocks:
        parallelize_module(layer, mesh, per_layer)
    return (f"tensor: {blocks.describe()} split over {mesh.size()} ranks by transformers' "
            f"base_model_tp_plan ({len(per_layer)} linears a layer)")
