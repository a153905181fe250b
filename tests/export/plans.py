"""Tiny hf:llama plans the export tests share: one process, DDP, ZeRO-2, ZeRO-3 offload."""

from __future__ import annotations

from typing import Any

from training_harness.core.plan import Plan

LLAMA = {"name": "hf:llama", "num_hidden_layers": 2, "hidden_size": 32,
         "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 128, "seq_len": 16}


def plan(strategies: dict[str, dict[str, Any]] | None = None, data: int = 1, mb: int = 2,
         gb: int | None = 4, **extra: Any) -> Plan:
    table = {"name": "tiny-llama", "device": "cpu", **extra, "workload": dict(LLAMA),
             "micro_batch_size": mb, "global_batch_size": gb, "warmup_steps": 1, "steps": 2,
             "layout": {"data": data}, "strategies": strategies or {}}
    return Plan.from_dict(table)


BEST = {"amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa", "optimizer": "fused"},
        "checkpoint": {"every": 1}}


def single() -> Plan:
    """bf16, SDPA, fused AdamW, every layer checkpointed, micro-batch 2 x accumulation 2."""
    return plan(BEST)


def ddp() -> Plan:
    return plan({**BEST, "ddp": {"bucket_cap_mb": 25.0}}, data=2, gb=8)


def zero(stage: int, offload: bool = False) -> Plan:
    return plan({"amp": {"dtype": "bf16"}, "zero": {"stage": stage, "offload": offload},
                 "checkpoint": {}}, data=2, gb=8)
