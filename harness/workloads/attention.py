"""Attention cores: the swappable part of a transformer block.

A core takes q, k, v shaped (batch, heads, seq, head_dim) and returns the same
shape. It holds no parameters, so swapping one for another changes neither the
state dict nor the optimizer; the `fused` strategy swaps Explicit for Sdpa or Flex.
SDPA's kernel (math, flash ...) is not the core's: `fused`'s sdpa_backend sets it for
the whole step (strategies.attention_backends), so transformers' SDPA calls get it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


@lru_cache(maxsize=1)
def compiled_flex() -> Callable[..., torch.Tensor]:
    """FlexAttention compiled, one function for the process: fast only compiled (eager it
    materialises the scores). Made at first use, not at import: torch.compile and
    torch.compiler.disable import dynamo (a CPU-second, and triton, which the kernel
    tests import first in interpreter mode)."""
    return torch.compile(flex_attention, dynamic=False)


class AttentionCore(nn.Module):
    """What every attention core holds: its dropout and whether it is causal."""

    def __init__(self, dropout: float = 0.0, causal: bool = True):
        super().__init__()
        self.dropout = dropout
        self.causal = causal


class ExplicitAttention(AttentionCore):
    """softmax(QKᵀ/√d + causal mask) V, materialising the (seq x seq) scores."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        if self.causal:
            t = q.size(-2)
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        probs = F.dropout(probs, self.dropout, self.training)
        return probs @ v


class SdpaAttention(AttentionCore):
    """torch's scaled_dot_product_attention: a fused (flash / memory-efficient) kernel."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@lru_cache(maxsize=32)
def causal_block_mask(seq: int, device: str) -> BlockMask:
    """The causal BlockMask of `seq` positions (flex's 128 x 128 blocks), made once."""
    return create_block_mask(causal_mask, None, None, seq, seq, device=device)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         mask: Callable[[int, str], BlockMask] | None, scale: float | None = None,
         enable_gqa: bool = False) -> torch.Tensor:
    """flex_attention with the block mask `mask(seq, device)` gives (made once per
    length and device), compiled on CUDA; eager elsewhere (torch 2.13 has no CPU
    backward for it, and its eager form materialises the scores)."""
    return _outside_compiled_blocks()(q, k, v, mask, scale, enable_gqa)


@lru_cache(maxsize=1)
def _outside_compiled_blocks() -> Callable[..., torch.Tensor]:
    # A compiled block calls out here: the compiled flex is its own graph, not the block's.
    return torch.compiler.disable(_flex)


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          mask: Callable[[int, str], BlockMask] | None, scale: float | None,
          enable_gqa: bool) -> torch.Tensor:
    block_mask = mask(q.size(-2), str(q.device)) if mask is not None else None
    fn = compiled_flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


class FlexAttention(AttentionCore):
    """torch's FlexAttention with a causal block mask: the blocks above the diagonal
    are skipped, those on it masked. No dropout (flex has none)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flex(q, k, v, causal_block_mask if self.causal else None)


ATTENTION = {"explicit": ExplicitAttention, "sdpa": SdpaAttention, "flex": FlexAttention}


def swap_attention(model: nn.Module, to: str) -> int:
    """Replace every attention core in `model` by the `to` kind; returns how many."""
    cls = ATTENTION[to]
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, AttentionCore) and not isinstance(child, cls)
    ]
    for parent, name, child in swaps:
        new = cls(dropout=child.dropout, causal=child.causal)
        new.train(child.training)
        setattr(parent, name, new)
    return len(swaps)
