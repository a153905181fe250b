"""Sparse causal attention: a sliding window, with global ("sink") tokens.

Query i sees key j when j <= i and (i - j < window or j < global_tokens): the last
`window` positions, itself included (Longformer's and Mistral's local attention), and
the first `global_tokens` positions, which every query sees (Longformer's and
BigBird's global tokens, StreamingLLM's attention sinks).

On CUDA it runs torch's FlexAttention, compiled, with a BlockMask made from that rule:
the (query, key) blocks wholly outside it are skipped, those on its edges masked. On
the CPU torch 2.13's FlexAttention has no backward, so the same rule is a dense boolean
mask to SDPA (its CPU flash kernel): the same maths, every block computed.

A core for the built-in GPT (swapped in like training_harness.workloads.attention's), and
an attention function for transformers' AttentionInterface (its public registry of
attention implementations) for `hf:` models whose attention goes through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask

from training_harness.workloads.attention import flex

HF_PREFIX = "harness_sparse"  # the AttentionInterface names this module registers


@dataclass(frozen=True)
class Pattern:
    window: int  # keys each query sees, itself included (>= 1)
    global_tokens: int = 0  # the first positions, seen by every query
    block: int = 128  # the BlockMask's block edge (queries and keys)

    def mask_mod(self):
        """The rule as FlexAttention's mask_mod (a plain function, as it requires)."""
        window, sinks = self.window, self.global_tokens

        def sparse(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (((q_idx - kv_idx) < window) | (kv_idx < sinks))

        return sparse

    @lru_cache(maxsize=64)  # noqa: B019 (keyed by the frozen pattern, kept for the process)
    def block_mask(self, seq: int, device: str) -> BlockMask:
        return create_block_mask(self.mask_mod(), None, None, seq, seq, device=device,
                                 BLOCK_SIZE=self.block)

    @lru_cache(maxsize=64)  # noqa: B019
    def dense_mask(self, seq: int, device: str) -> torch.Tensor:
        return create_mask(self.mask_mod(), None, None, seq, seq, device=device)

    def computed_fraction(self, seq: int) -> float:
        """Of all (query block, key block) pairs of `seq` positions, the share the
        BlockMask computes (partly masked blocks included): counted from the mask."""
        mask = self.block_mask(seq, "cpu")
        computed = int(mask.kv_num_blocks.sum())
        if mask.full_kv_num_blocks is not None:
            computed += int(mask.full_kv_num_blocks.sum())
        blocks = -(-seq // self.block)
        return computed / (blocks * blocks)


def attend(pattern: Pattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """q (b, heads, s, d), k and v (b, kv heads, s, d) -> (b, heads, s, d)."""
    gqa = q.size(1) != k.size(1)
    if q.device.type == "cuda":
        return flex(q, k, v, pattern.block_mask, scale=scale, enable_gqa=gqa)
    mask = pattern.dense_mask(q.size(-2), str(q.device))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=gqa)


class SparseAttention(nn.Module):
    """The built-in GPT's attention core with the sparse pattern (no dropout)."""

    def __init__(self, pattern: Pattern, causal: bool = True):
        super().__init__()
        self.pattern = pattern
        self.dropout = 0.0
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(self.pattern, q, k, v)

    def extra_repr(self) -> str:
        p = self.pattern
        return f"window={p.window}, global_tokens={p.global_tokens}, block={p.block}"


def swap_in(model: nn.Module, pattern: Pattern) -> int:
    """Replace every attention core of the built-in models by the sparse one."""
    from training_harness.workloads.attention import AttentionCore

    swaps = [(parent, name) for parent in model.modules() for name, child in
             parent.named_children() if isinstance(child, (AttentionCore, SparseAttention))]
    for parent, name in swaps:
        setattr(parent, name, SparseAttention(pattern))
    return len(swaps)


def hf_implementation(pattern: Pattern) -> str:
    """The name of an attention function for `pattern`, registered with transformers'
    AttentionInterface; `model.set_attn_implementation(name)` switches a model to it.
    transformers makes no mask for a name its mask interface does not know, so the
    function gets attention_mask None and applies the pattern itself (the harness's
    batches are whole sequences, no padding)."""
    from transformers import AttentionInterface

    name = f"{HF_PREFIX}_w{pattern.window}_g{pattern.global_tokens}_b{pattern.block}"
    AttentionInterface.register(name, partial(_hf_forward, pattern))
    return name


def _hf_forward(pattern: Pattern, module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (b, heads, s, d) in, the output as
    (b, s, heads, d) and no weights out."""
    out = attend(pattern, query, key, value, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
