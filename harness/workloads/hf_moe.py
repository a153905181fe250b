"""Mixture-of-experts models of transformers (Mixtral, Qwen-MoE, OLMoE, DeepSeek ...):
which parameters are experts, how many of them a token uses, and the router's loss.

A token passes through `k` of a layer's `E` routed experts (`num_experts_per_tok` and
its other spellings), so a routed expert's parameters do `k / E` of the work a dense
layer's would: the FLOPs count each routed group at that fraction, the router (a
dense E x hidden matrix every token meets) and shared experts in full. Memory keeps
all experts resident: the state is counted from every parameter.

The routed experts are the modules named `experts`: transformers' fused ones (3-D
weights, one slice per expert: `gate_up_proj` [E, 2F, H], `down_proj` [E, H, F]) or a
ModuleList of expert MLPs. Shared experts (`shared_expert`, `shared_experts`) are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

TOP_K_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k",
                "top_k", "num_selected_experts", "moe_k", "router_top_k")
AUX_COEF_FIELDS = ("router_aux_loss_coef", "aux_loss_coef")


@dataclass
class ExpertGroup:
    name: str  # qualified name of the `experts` module
    experts: int  # E
    parameters: int  # all E experts' parameters


def _field(config: Any, names: tuple[str, ...]) -> int | None:
    """The first of `names` set on the config, or on a sub-config such as dbrx's ffn_config."""
    holders = [config] + [v for v in vars(config).values() if hasattr(v, "__dict__")
                          or isinstance(v, dict)]
    for holder in holders:
        for name in names:
            v = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


# Models whose code fixes k rather than reading it from the config.
TOP_K_BY_TYPE = {"switch_transformers": 1, "nllb-moe": 2}


def top_k(config: Any) -> int | None:
    """Experts per token, where the config says (or the model's code fixes it)."""
    return _field(config, TOP_K_FIELDS) or TOP_K_BY_TYPE.get(getattr(config, "model_type", ""))


def expert_groups(model: nn.Module) -> list[ExpertGroup]:
    """Every routed experts module of the model (none for a dense one)."""
    groups = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "experts":
            continue
        params = list(module.parameters())
        if not params:
            continue
        if isinstance(module, nn.ModuleList | nn.ModuleDict):  # Switch: expert_0, expert_1 ...
            count = len(module)
        else:
            stacked = [p.shape[0] for p in params if p.dim() == 3]
            if not stacked:
                continue
            count = max(stacked)
        groups.append(ExpertGroup(name, count, sum(p.numel() for p in params)))
    return groups


def inactive_parameters(model: nn.Module, config: Any) -> tuple[int, str | None]:
    """Parameters a token does not use (routed experts beyond its k), and a note when the
    model has experts but no config field says k (then every expert is counted)."""
    groups = expert_groups(model)
    if not groups:
        return 0, None
    k = top_k(config)
    if k is None:
        return 0, (f"{type(config).__name__} names no experts-per-token field "
                   f"({', '.join(TOP_K_FIELDS[:3])} ...): every expert's FLOPs are counted")
    return sum(g.parameters - g.parameters * min(k, g.experts) // g.experts
               for g in groups), None


def aux_loss_coef(config: Any) -> float | None:
    """The router's auxiliary-loss weight, where the model defines one."""
    for name in AUX_COEF_FIELDS:
        v = getattr(config, name, None)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None
