"""Tiny Hugging Face configs (2 layers, width 32, vocab 64, 16 tokens), dropout off so
that techniques which draw random numbers in another order (accumulation) still
compare exactly with the fp32 run."""

from __future__ import annotations

import pytest

TINY_HF = {
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, vocab_size=64, seq_len=16),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=32, seq_len=16,
                 bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0),
    "bert": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, vocab_size=64, seq_len=16, max_position_embeddings=32,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}


def needs_transformers() -> None:
    from harness.core.errors import HarnessError
    from harness.workloads import optional

    try:
        optional.transformers()
    except HarnessError as e:
        pytest.skip(str(e))


def needs_torchvision() -> None:
    from harness.core.errors import HarnessError
    from harness.workloads import optional

    try:
        optional.torchvision()
    except HarnessError as e:
        pytest.skip(str(e))


def tiny_hf(model_type: str, **overrides):
    from harness.workloads import load_workload

    return load_workload(f"hf:{model_type}", {**TINY_HF[model_type], **overrides})
