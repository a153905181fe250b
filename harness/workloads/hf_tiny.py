"""A tiny config of any transformers model type, made from its field names.

`tiny_fields("qwen2")` gives the [workload] arguments of a model of 2 layers, width 64,
4 attention heads (2 key/value heads), vocabulary 512 and, for a mixture of experts, 4
experts with 2 per token: what the zoo sweep (tests/workloads/zoo_hf.py, tests/test_zoo_hf.py)
builds every model type with. Only fields the type's config has are set, by the names
it uses (GPT-2's n_layer, T5's d_model ...), and they go to the config's constructor,
so the fields it derives from them (layer_types ...) follow.
"""

from __future__ import annotations

from typing import Any

from training_harness.workloads.hf_config import derived_fields

SEQ_LEN = 32
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 64, 4, 2, 128, 512

_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "moe_k")
_HEAD_DIMS = ("head_dim", "d_kv", "attention_head_dim", "kv_channels", "rotary_dim")
# set even where the default is None (the model derives them, or needs them given)
_WHEN_NONE = _TOP_K + _HEAD_DIMS + ("vocab_size",)
_SET: list[tuple[int, tuple[str, ...]]] = [
    (LAYERS, ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
             "decoder_layers", "num_decoder_layers", "num_encoder_layers")),
    (HIDDEN, ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "model_dim", "emb_dim",
             "word_embed_proj_dim", "embedding_size", "hidden_dim_model")),
    (HEADS, ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
            "decoder_attention_heads")),
    (KV_HEADS, ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
               "num_key_value_groups_count")),
    (FFN, ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "ffn_hidden_size",
          "encoder_ffn_dim", "decoder_ffn_dim", "hidden_dim", "inner_hidden_size",
          "shared_expert_intermediate_size", "dense_intermediate_size")),
    (HIDDEN // HEADS, _HEAD_DIMS),
    (VOCAB, ("vocab_size",)),
    (32, ("moe_intermediate_size", "expert_ffn_hidden_size",
          "moe_shared_expert_intermediate_size")),
    (4, _EXPERTS),
    (2, _TOP_K),
]
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "cls_token_id",
             "mask_token_id", "unk_token_id", "decoder_start_token_id")
# Larger widths under other names are shrunk to HIDDEN; these sizes are not widths.
_NOT_WIDTHS = ("vocab", "position", "max_", "image", "patch", "window", "chunk", "bucket",
               "sample", "length", "seq", "context", "cache", "num_", "period", "token")


def _default(model_type: str) -> Any:
    from training_harness.workloads import optional

    return optional.transformers().AutoConfig.for_model(model_type)


def tiny_fields(model_type: str) -> dict[str, Any]:
    """[workload] arguments for a tiny `model_type` (dropout left as the config has it)."""
    config = _default(model_type)
    fields = _shrunk(config.to_dict())
    for name, sub in vars(config).items():  # an encoder-decoder's or a hybrid's sub-configs
        if hasattr(sub, "to_dict") and hasattr(sub, "model_type") and name != "text_config":
            whole, small = sub.to_dict(), _shrunk(sub.to_dict())
            for key in derived_fields(type(sub), small):  # derived again from the small ones
                whole.pop(key, None)
            fields[name] = {**whole, **small}
    fields["seq_len"] = SEQ_LEN
    return fields


def _shrunk(have: dict[str, Any]) -> dict[str, Any]:
    """The tiny values of the fields `have` (a config's to_dict()) holds."""
    fields: dict[str, Any] = {}
    experts = any(isinstance(have.get(n), int) for n in _EXPERTS)
    for value, names in _SET:
        for name in names:
            v = have.get(name)
            if (isinstance(v, int) and not isinstance(v, bool)) or (
                    v is None and name in have and name in _WHEN_NONE
                    and (experts or name not in _TOP_K)):
                fields[name] = value
    if isinstance(have.get("expand"), int) and "num_heads" in fields and "head_dim" in fields:
        fields["head_dim"] = HIDDEN * have["expand"] // HEADS  # Mamba-2: heads x dim = inner
    if isinstance(have.get("attention_types"), list):  # GPT-Neo: [[pattern, repeats]]
        fields["attention_types"] = [[["global", "local"], LAYERS // 2]]
    for name in ("n_group", "topk_group", "n_groups"):  # DeepSeek's routing, Mamba-2's heads
        if isinstance(have.get(name), int):
            fields[name] = 1
    for name, v in have.items():  # other widths: a latent, a projection ... (not counts)
        if (name not in fields and isinstance(v, int) and not isinstance(v, bool) and v > FFN
                and name.endswith(("_size", "_dim", "_rank", "_channels"))
                and not any(w in name for w in _NOT_WIDTHS)):
            fields[name] = HIDDEN
    if "qk_rope_head_dim" in have:  # multi-head latent attention: head_dim is the rope part
        for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if isinstance(have.get(name), int):
                fields[name] = HIDDEN // HEADS
        fields.pop("qk_head_dim", None)
        fields.pop("head_dim", None)
        if "num_key_value_heads" in fields:  # keys and values come per head from the latent
            fields["num_key_value_heads"] = HEADS
    if "n_positions" in have and have["n_positions"] and have["n_positions"] < SEQ_LEN:
        fields["n_positions"] = SEQ_LEN
    for name in TOKEN_IDS:
        v = have.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v >= VOCAB - 1:
            fields[name] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}.get(name, 3)
        elif isinstance(v, list) and any(isinstance(i, int) and i >= VOCAB for i in v):
            fields[name] = 2
    if "first_k_dense_replace" in have:
        fields["first_k_dense_replace"] = 1  # one dense layer, one mixture of experts
    for name in ("encoder_hash_byte_group_vocab",):  # BLT's hash embeddings: rows, not width
        if isinstance(have.get(name), int):
            fields[name] = VOCAB
    return fields
