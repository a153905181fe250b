"""Tensor parallel for `hf:` workloads: the model's own `base_model_tp_plan`, else the
harness's plan (below), per layer.

transformers ships a plan for many decoders (Llama, Qwen2, Mistral ...):
{"layers.*.self_attn.q_proj": "colwise", ..., "layers.*.mlp.down_proj": "rowwise"}.
Its entries under the decoder layers are applied to each layer with torch's
ColwiseParallel / RowwiseParallel, as strategies.tensor does for the gpt: each rank
computes whole heads (the attention reshapes with -1 heads, so the local count
follows) and its slice of the MLP; embeddings, norms and the head stay replicated. A
model plan with styles other than colwise / rowwise in its layers is refused.

A model without one (BERT, OPT, DistilBERT ...) gets the harness's plan, read off one
layer by module type and name: the attention's q/k/v projections split by output rows
(colwise), its output projection by input columns (rowwise); the MLP's up/gate
projection colwise, its down projection rowwise; the rowwise linears' all-reduce
restores the full activations, as in Megatron. Names taken (relative to a layer; the
last part, or the end of the path):
    colwise, attention: q_proj k_proj v_proj, query key value, q_lin k_lin v_lin
    rowwise, attention: o_proj out_proj out_lin, attention.output.dense (BERT)
    colwise, MLP: up_proj gate_proj fc1 fc_in lin1 w1 w3 dense_h_to_4h,
                  intermediate.dense (BERT)
    rowwise, MLP: down_proj fc2 fc_out lin2 w2 dense_4h_to_h, output.dense (BERT)

A layout that cannot be split so is refused with the reason, never guessed at: q, k
and v fused in one weight (GPT-2's Conv1D c_attn, Falcon's query_key_value: a
column split would give rank 0 all of q), a linear of another type (Conv1D,
FalconLinear: its own forward), or a linear the names above do not place (left
whole, it would see a shard where it expects the full width, or the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from training_harness.core.errors import HarnessError
from training_harness.workloads.blocks import find_blocks
from training_harness.workloads.hf import HFWorkload

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
LAYER = "layers.*."
QKV = {"q_proj", "k_proj", "v_proj", "query", "key", "value", "q_lin", "k_lin", "v_lin"}
ATTN_OUT = {"o_proj", "out_proj", "out_lin"}
MLP_IN = {"up_proj", "gate_proj", "fc1", "fc_in", "lin1", "w1", "w3", "dense_h_to_4h"}
MLP_OUT = {"down_proj", "fc2", "fc_out", "lin2", "w2", "dense_4h_to_h"}
FUSED = {"c_attn", "query_key_value", "qkv_proj", "qkv", "Wqkv", "in_proj", "gate_up_proj"}
# The attention module's head counts: it reshapes with them (OPT's view(b, -1, heads,
# head_dim)), so each rank's attention must see its own share.
HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "num_key_value_heads",
              "num_kv_heads", "all_head_size")


@dataclass
class LayerPlan:
    """Where each linear of a layer goes: {relative name: "colwise" | "rowwise"}."""

    attention: dict[str, str] = field(default_factory=dict)
    mlp: dict[str, str] = field(default_factory=dict)
    refused: str | None = None  # why this layer cannot be split

    def styles(self, mlp: bool) -> dict[str, str]:
        return {**self.attention, **(self.mlp if mlp else {})}


def _place(name: str) -> tuple[str, str] | None:
    """("attention" | "mlp", "colwise" | "rowwise") for a linear's relative name."""
    last = name.rpartition(".")[2]
    if name.endswith("attention.output.dense"):
        return "attention", "rowwise"
    if name.endswith("intermediate.dense"):
        return "mlp", "colwise"
    if name == "output.dense" or name.endswith(".output.dense"):
        return "mlp", "rowwise"
    for names, part, style in ((QKV, "attention", "colwise"), (ATTN_OUT, "attention", "rowwise"),
                               (MLP_IN, "mlp", "colwise"), (MLP_OUT, "mlp", "rowwise")):
        if last in names:
            return part, style
    return None


def _is_linear_like(module: nn.Module) -> bool:
    """A leaf module holding a 2-D weight: a linear of some kind (Conv1D, FalconLinear)."""
    weight = getattr(module, "weight", None)
    return (not isinstance(module, nn.Embedding | nn.LayerNorm) and weight is not None
            and getattr(weight, "dim", lambda: 0)() == 2 and not list(module.children()))


def layer_plan(layer: nn.Module) -> LayerPlan:
    """The plan of one layer, or its `refused` reason."""
    plan = LayerPlan()
    for name, module in layer.named_modules():
        if not name or not _is_linear_like(module):
            continue
        kind = type(module).__name__
        if name.rpartition(".")[2] in FUSED:
            plan.refused = (f"its layers fuse q, k and v (or gate and up) in one {kind} "
                            f"({name}): a column split would give rank 0 all of q, not each "
                            "rank its own heads")
            return plan
        if type(module) is not nn.Linear:
            plan.refused = (f"its layers hold a {kind} ({name}), not torch's nn.Linear: "
                            "torch's colwise/rowwise styles split nn.Linear only")
            return plan
        placed = _place(name)
        if placed is None:
            plan.refused = (f"the harness's plan does not place its linear '{name}' (neither "
                            "an attention q/k/v/output nor an MLP up/down projection)")
            return plan
        getattr(plan, placed[0])[name] = placed[1]
    cols = [n for n, s in plan.attention.items() if s == "colwise"]
    rows = [n for n, s in plan.attention.items() if s == "rowwise"]
    if len(cols) < 3 or len(rows) != 1:
        plan.refused = ("the harness found no q, k, v and output projections in its layers "
                        f"(found {sorted(plan.attention) or 'none'})")
    elif plan.mlp and sorted(set(plan.mlp.values())) != ["colwise", "rowwise"]:
        plan.refused = f"its MLP is not an up and a down projection ({sorted(plan.mlp)})"
    return plan


def plan_for(blocks) -> LayerPlan:
    """One plan for every layer (`blocks`: training_harness.workloads.blocks.Blocks)."""
    plans = [layer_plan(layer) for layer in blocks]
    first = plans[0]
    if first.refused is None and any(p.styles(True) != first.styles(True) for p in plans[1:]):
        first.refused = "its layers differ in their linears, so one plan cannot split them all"
    return first


def uneven(layer: nn.Module, plan: LayerPlan, ranks: int, mlp: bool) -> list[str]:
    """The linears whose split dimension does not divide over `ranks`."""
    out = []
    for name, style in plan.styles(mlp).items():
        linear = layer.get_submodule(name)
        size = linear.out_features if style == "colwise" else linear.in_features
        if size % ranks:
            out.append(f"{name} ({'out' if style == 'colwise' else 'in'}_features {size})")
    return out


def localise_heads(layer: nn.Module, plan: LayerPlan, ranks: int) -> None:
    """Give each attention module holding a q/k/v projection its share of the heads."""
    owners = {name.rpartition(".")[0] for name, s in plan.attention.items() if s == "colwise"}
    for owner in owners:
        module = layer.get_submodule(owner)
        for attr in HEAD_ATTRS:
            value = getattr(module, attr, None)
            if type(value) is int and value % ranks == 0:
                setattr(module, attr, value // ranks)


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
    plan = plan_for(blocks)
    if plan.refused:
        return [f"tensor parallel: transformers gives '{t}' no base_model_tp_plan, and the "
                f"harness's own plan cannot split it: {plan.refused}; leave tensor out "
                "(layout tensor = 1)"]
    out = _head_reasons(workload.config, ranks)
    odd = uneven(blocks[0], plan, ranks, mlp)
    if odd:
        out.append(f"tensor parallel over {ranks} ranks needs the split sizes divisible by "
                   f"{ranks}: {', '.join(odd)}" + ("; or mlp = false" if mlp else ""))
    return out


def apply(model: nn.Module, mesh, mlp: bool) -> str:
    """Split every layer of `model` over `mesh`; returns the note."""
    blocks = find_blocks(model)
    if blocks is None:
        raise HarnessError("tensor: the model has no layers to split")
    own = model_plan(model.config, mlp)
    plan = None if own is not None else plan_for(blocks)
    if plan is not None and plan.refused:
        raise HarnessError(f"tensor: {plan.refused}")
    styles = own if own is not None else plan.styles(mlp)
    per_layer = {name: STYLES[style]() for name, style in styles.items()}
    for layer in blocks:
        if plan is not None:
            localise_heads(layer, plan, mesh.size())
        parallelize_module(layer, mesh, per_layer)
    source = "transformers' base_model_tp_plan" if own is not None else "the harness's plan"
    # transformers >= 5.25 moved a mixture's experts out of the tensor plan into an
    # expert-parallel one (base_model_ep_plan), which this strategy does not apply
    whole = ("; the experts stay whole on every rank (the model's expert-parallel plan "
             "is not applied)" if getattr(model.config, "base_model_ep_plan", None) else "")
    return (f"tensor: {blocks.describe()} split over {mesh.size()} ranks by {source} "
            f"({len(per_layer)} linears a layer){whole}")
