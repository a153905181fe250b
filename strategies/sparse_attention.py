"""Sparse attention: causal sliding-window attention with optional global tokens,
block-sparse through FlexAttention (training_harness.workloads.sparse_attention).

Each query sees the last `window` positions (itself included) and the first
`global_tokens` positions. The window is `window` tokens, or, when that is 0,
`window_fraction` of the workload's sequence length (what the search varies). On
CUDA FlexAttention skips the (query, key) blocks of `block` x `block` positions that
lie wholly outside the pattern; on the CPU (torch 2.13's FlexAttention has no
backward there) the same pattern is a dense mask to SDPA.

It changes what is trained, so it is judged by time to a target loss, as the
curriculum is. Its FLOPs: the workload's 6N + 12·L·H·Q·T per token counts the full
T x T attention (PaLM's convention); here the attention term is multiplied by the share
of (query, key) blocks the BlockMask computes: blocks computed, partly masked ones in
full, not the pattern's exact pairs (that is the work a block-sparse kernel does). On
the CPU every block is computed all the same; the count stays the model's, as 6N does.

The built-in GPT (its attention cores swapped at the module-swap phase) and `hf:` causal
LMs whose attention goes through transformers' AttentionInterface. Refused for masked
LMs and encoder-decoders (not causal self-attention), with attention dropout (flex has
none), with window >= seq_len (that is full causal attention), and beside the
curriculum (its lengths change the mask and the FLOPs step by step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.strategies.attention_backends import attention_dropout, hf_refuses
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register
from training_harness.workloads.sparse_attention import Pattern, hf_implementation, swap_in


@dataclass
class SparseAttentionSettings:
    window: int = bounded(0, 0, 2**24)  # keys each query sees, itself included; 0: fraction
    window_fraction: float = bounded(0.25, 0.0, 1.0)  # of seq_len, when window = 0
    global_tokens: int = bounded(0, 0, 2**24)  # the first positions, seen by every query
    block: int = bounded(128, 1, 2**16)  # the BlockMask's block edge (flex's default 128)


def pattern_of(settings: SparseAttentionSettings, seq_len: int) -> Pattern:
    window = settings.window or int(settings.window_fraction * seq_len)
    return Pattern(window=window, global_tokens=settings.global_tokens, block=settings.block)


def attention_flops_per_sample(workload: Any) -> float:
    """The attention term of the workload's count: 12·L·H·Q·T per token, T tokens."""
    from training_harness.workloads.hf import HFWorkload, attention_width

    t = workload.tokens_per_sample
    if isinstance(workload, HFWorkload):
        return 12.0 * attention_width(workload.config) * t * t
    shape = workload.shape
    return 12.0 * shape.layers * shape.hidden * t * t


def flops_per_sample(workload: Any, pattern: Pattern) -> float:
    """The workload's FLOPs with the attention term at the computed blocks' share."""
    attention = attention_flops_per_sample(workload)
    share = pattern.computed_fraction(workload.tokens_per_sample)
    return workload.flops_per_sample() - attention * (1.0 - share)


def causal_lm(name: str, args: dict[str, Any]) -> tuple[Any, str | None]:
    """(the workload, None) for a gpt or hf: causal LM; else (None or the workload,
    the reason in words). A workload that cannot load is (None, None): its own check
    says why."""
    from training_harness.workloads import load_workload
    from training_harness.workloads.hf import HFWorkload

    if name != "gpt" and not name.startswith("hf:"):
        return None, (f"workload '{name}' is not a language model; sparse_attention is for "
                      "gpt and hf: causal LMs")
    try:
        w = load_workload(name, args)
    except HarnessError:
        return None, None
    if isinstance(w, HFWorkload) and w.seq2seq:
        return w, (f"{w.name} is an encoder-decoder; sparse_attention is for decoder-only "
                   "causal LMs")
    if isinstance(w, HFWorkload) and not w.causal:
        return w, (f"{w.name} is a masked LM (each token sees both sides); sparse_attention "
                   "is causal: use a causal LM")
    return w, None


def plan_pattern(table: dict[str, Any], workload: str, args: dict[str, Any]) -> Pattern | None:
    """The pattern a plan's [strategies.sparse_attention] gives its workload (the
    estimator's), None for a workload it does not apply to."""
    w, why = causal_lm(workload, args)
    if w is None or why:
        return None
    return pattern_of(SparseAttention().parse(table), w.tokens_per_sample)


@lru_cache(maxsize=32)
def _hf_reason(workload: str, args_json: str, name: str) -> str | None:
    """Why the hf: model's attention cannot take the pattern (built on meta), or None."""
    from training_harness.workloads import load_workload
    from training_harness.workloads.hf import attention_width

    args = json.loads(args_json)
    w = load_workload(workload, args)
    if attention_width(w.config) == 0:
        return f"{w.name} has no attention heads (a state-space model): nothing to make sparse"
    why = hf_refuses(workload, args, name)
    if why:
        return (f"{w.name}'s attention does not go through transformers' AttentionInterface "
                f"({why})")
    return None


class SparseAttention(Strategy):
    name = "sparse_attention"
    summary = ("sliding-window causal attention (window, global tokens), block-sparse "
               "through FlexAttention; FLOPs counted for the blocks computed")
    phases = (Phase.MODULE_SWAP,)
    Settings = SparseAttentionSettings
    requires = ("a gpt or hf: causal LM (its attention through transformers' "
                "AttentionInterface); Triton on a GPU; no attention dropout")

    def space(self):
        return {"window_fraction": Choice((0.125, 0.25, 0.5)),
                "global_tokens": Choice((0, 4))}

    def check(self, settings, plan, env):
        workload, why = causal_lm(plan.workload, plan.workload_args)
        if why:
            return [f"sparse_attention: {why}"]
        if workload is None:
            return []  # the workload's own check says what is wrong with it
        reasons = []
        seq = workload.tokens_per_sample
        pattern = pattern_of(settings, seq)
        if pattern.window < 1:
            reasons.append(f"sparse_attention: a window of {settings.window_fraction:g} x "
                           f"seq_len {seq} is under one token; raise window_fraction or set "
                           "window")
        elif pattern.window >= seq:
            reasons.append(f"sparse_attention: window {pattern.window} >= seq_len {seq} is "
                           "full causal attention, which changes nothing; lower the window")
        if hasattr(workload, "config"):  # hf:
            args = json.dumps(plan.workload_args, sort_keys=True, default=str)
            why = _hf_reason(plan.workload, args, hf_implementation(pattern))
            if why:
                reasons.append(f"sparse_attention: {why}")
        if attention_dropout(plan.workload, plan.workload_args) > 0:
            reasons.append("sparse_attention: FlexAttention has no attention dropout, and the "
                           "workload's is above 0; set its dropout to 0")
        if env.device_type == "cuda" and not env.triton:
            reasons.append("sparse_attention compiles FlexAttention to a Triton kernel on a "
                           "GPU; install triton")
        if "curriculum" in plan.strategies:
            reasons.append("sparse_attention beside curriculum: the curriculum's lengths "
                           "change the block mask and the FLOPs step by step, which is not "
                           "wired; drop one of them")
        return reasons

    def apply(self, phase, setup, settings):
        from training_harness.core.plan import Plan

        plan = setup.plan or Plan()
        workload, why = causal_lm(plan.workload, plan.workload_args)
        if workload is None or why:
            raise HarnessError(f"sparse_attention: {why or 'the workload could not be loaded'}")
        seq = workload.tokens_per_sample
        pattern = pattern_of(settings, seq)
        swapped = swap_in(setup.model, pattern)
        where = f"{swapped} attention cores"
        if not swapped:
            name = hf_implementation(pattern)
            setup.model.set_attn_implementation(name)
            where = f"transformers attn_implementation -> {name}"
        share = pattern.computed_fraction(seq)
        flops = flops_per_sample(workload, pattern)
        setup.work_at = lambda step: (flops, float(seq))
        setup.notes.append(
            f"sparse_attention: {where}; window {pattern.window} of {seq}, "
            f"{pattern.global_tokens} global tokens, blocks of {pattern.block}: "
            f"{share:.1%} of the (query, key) blocks computed, the attention FLOPs counted at "
            "that share"
            + ("" if setup.device.type == "cuda" else
               " (on the CPU a dense mask: every block runs, the count stays the model's)"))


register(SparseAttention())
