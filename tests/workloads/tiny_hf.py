"""Tiny Hugging Face configs (2 layers, width 32, vocab 64, 16 tokens), dropout off so
that techniques which draw random numbers in another order (accumulation) still
compare exactly with the fp32 run; and a small torchvision model (4 classes, 64 px: at
32 px ResNet's last BatchNorms see one value per image and training turns chaotic)."""

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
    # No base_model_tp_plan: tensor parallel by the harness's own plan.
    "opt": dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
                vocab_size=64, seq_len=16, max_position_embeddings=32, word_embed_proj_dim=32,
                dropout=0.0, attention_dropout=0.0),
    "distilbert": dict(dim=32, hidden_dim=64, n_layers=2, n_heads=2, vocab_size=64, seq_len=16,
                       max_position_embeddings=32, dropout=0.0, attention_dropout=0.0),
}
TINY_VISION = {"resnet18": dict(num_classes=4, image_size=64)}
# A mixture of experts (4 experts, 2 per token), kept apart from TINY_HF: torch's FLOP
# counter does not count its grouped expert matmuls. Its router loss is off here, so a
# data-parallel run compares exactly with one process (the load-balancing loss of a
# micro-batch is not the mean of its halves'); tests/test_zoo_hf.py trains it with it on.
TINY_MOE = {"mixtral": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                            seq_len=16, num_local_experts=4, num_experts_per_tok=2,
                            output_router_logits=False)}
# An encoder-decoder (copy with noise), apart too: both stacks' blocks are sharded.
TINY_SEQ2SEQ = {"t5": dict(num_layers=2, num_decoder_layers=2, d_model=32, num_heads=2, d_kv=16,
                           d_ff=64, vocab_size=64, seq_len=16, dropout_rate=0.0)}


def workload_spec(key: str) -> tuple[str, dict]:
    """(workload name, arguments) of a key of TINY_HF or TINY_VISION."""
    if key in TINY_VISION:
        return f"torchvision:{key}", TINY_VISION[key]
    if key in TINY_MOE:
        return f"hf:{key}", TINY_MOE[key]
    if key in TINY_SEQ2SEQ:
        return f"hf:{key}", TINY_SEQ2SEQ[key]
    return f"hf:{key}", TINY_HF[key]


def tiny(key: str):
    from training_harness.workloads import load_workload

    return load_workload(*workload_spec(key))


def needs_transformers() -> None:
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import optional

    try:
        optional.transformers()
    except HarnessError as e:
        pytest.skip(str(e))


def needs_torchvision() -> None:
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import optional

    try:
        optional.torchvision()
    except HarnessError as e:
        pytest.skip(str(e))


def tiny_hf(model_type: str, **overrides):
    from training_harness.workloads import load_workload

    return load_workload(f"hf:{model_type}", {**TINY_HF[model_type], **overrides})
