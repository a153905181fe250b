"""Pipeline stages of an `hf:` decoder, cut at decoder-layer boundaries.

transformers marks the models whose forward can be cut so with `base_model_pp_plan`
(embed_tokens -> layers -> norm: Llama, Qwen2, Mistral ...). A stage holds a run of
decoder layers, plus the token embedding (first stage) or the final norm and LM head
(last), and builds what the layers take besides the hidden states itself: the rotary
position embeddings, and the causal mask for eager attention (SDPA gets none and runs
causal). Models without such a plan (GPT-2, BERT) are refused with the reason, as
are tied embeddings (the head and the embedding would sit on two stages).
"""

from __future__ import annotations

import torch
from torch import nn

from training_harness.workloads.hf import HFWorkload
from training_harness.workloads.hf_head import criterion_of

PARTS = ("embed_tokens", "layers", "norm")  # of model.model, with model.lm_head


def reasons(workload: HFWorkload, stages: int) -> list[str]:
    c, t = workload.config, workload.source.model_type
    if not getattr(c, "base_model_pp_plan", None) or not workload.causal:
        return [f"pipeline: transformers gives '{t}' no base_model_pp_plan, so its forward "
                "cannot be cut at decoder-layer boundaries here; leave pipeline out"]
    out = []
    if c.num_hidden_layers % stages:
        out.append(f"pipeline: {c.num_hidden_layers} decoder layers do not split evenly into "
                   f"{stages} stages; choose num_hidden_layers as a multiple of {stages}")
    if getattr(c, "output_router_logits", False):
        out.append("pipeline stages pass hidden states only, so a mixture of experts' router "
                   "loss (output_router_logits) would be dropped; set output_router_logits = "
                   "false in [workload] to pipeline it without")
    if getattr(c, "tie_word_embeddings", False):
        out.append("pipeline cannot tie the LM head to the token embedding: they sit on the "
                   "last and the first stage; set tie_word_embeddings = false in [workload]")
    return out


def causal_mask(x: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] additive mask: 0 on and below the diagonal, the dtype's minimum above."""
    t = x.size(1)
    upper = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return torch.zeros(t, t, device=x.device).masked_fill(upper, torch.finfo(torch.float32).min)[
        None, None
    ]


class HFStage(nn.Module):
    """Consecutive decoder layers (`blocks`), plus the embedding or the norm and head."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        base = model.model
        self.config = model.config
        self.embed_tokens = base.embed_tokens if first else None
        self.blocks = nn.ModuleList(base.layers[i] for i in layers)
        self.norm = base.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rotary_emb = getattr(base, "rotary_emb", None)  # buffers only, no parameters
        # fused linear_cross_entropy: the last stage hands on the norm's output, and the
        # loss takes the head's weight from here (pipeline.fused_head_loss_fn)
        self.head_in_loss = criterion_of(model) is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:  # x: token ids
            x = self.embed_tokens(x)
        pos = torch.arange(x.size(1), device=x.device)[None]
        extra = {"position_ids": pos}
        if self.rotary_emb is not None:
            extra["position_embeddings"] = self.rotary_emb(x, pos)
        eager = self.config._attn_implementation == "eager"
        mask = causal_mask(x) if eager else None
        for layer in self.blocks:
            out = layer(x, attention_mask=mask, **extra)
            x = out[0] if isinstance(out, tuple) else out  # a tuple before transformers 5
        if self.lm_head is not None:
            x = self.norm(x)
            if not self.head_in_loss:
                x = self.lm_head(x)
        return x


def is_splittable(model: nn.Module) -> bool:
    base = getattr(model, "model", None)
    return hasattr(model, "lm_head") and all(hasattr(base, p) for p in PARTS)


def stages(model: nn.Module, ids: list[int], total: int) -> list[HFStage]:
    """Stage modules `ids` of `total`, each an even share of the decoder layers."""
    per = len(model.model.layers) // total
    return [HFStage(model, range(s * per, (s + 1) * per), s == 0, s == total - 1) for s in ids]
