"""Attention cores: the swappable part of a transformer block.

A core takes q, k, v shaped (batch, heads, seq, head_dim) and returns the same
shape. It holds no parameters, so swapping one for another changes neither the
state dict nor the optimizer; the `fused` strategy swaps Explicit for Sdpa.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ExplicitAttention(nn.Module):
    """softmax(QKᵀ/√d + causal mask) V, materialising the (seq x seq) scores."""

    def __init__(self, dropout: float = 0.0, causal: bool = True):
        super().__init__()
        self.dropout = dropout
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        if self.causal:
            t = q.size(-2)
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        probs = F.dropout(probs, self.dropout, self.training)
        return probs @ v


class SdpaAttention(nn.Module):
    """torch's scaled_dot_product_attention: a fused (flash / memory-efficient) kernel."""

    def __init__(self, dropout: float = 0.0, causal: bool = True):
        super().__init__()
        self.dropout = dropout
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )


ATTENTION = {"explicit": ExplicitAttention, "sdpa": SdpaAttention}


def swap_attention(model: nn.Module, to: str) -> int:
    """Replace every attention core in `model` by the `to` kind; returns how many."""
    cls = ATTENTION[to]
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, tuple(ATTENTION.values())) and not isinstance(child, cls)
    ]
    for parent, name, child in swaps:
        new = cls(dropout=child.dropout, causal=child.causal)
        new.train(child.training)
        setattr(parent, name, new)
    return len(swaps)
