"""Hugging Face transformers as workloads: `hf:llama`, `hf:gpt2`, `hf:bert`, `hf:/folder`.

In a plan:

    [workload]
    name = "hf:llama"
    num_hidden_layers = 4        # any field of the model's config
    hidden_size = 256
    seq_len = 128                # tokens per sample
    attn_implementation = "eager"   # the fused strategy switches it to "sdpa"

Causal LMs learn next-token prediction, encoders (BERT, RoBERTa ...) masked-LM, on
seeded synthetic tokens (training_harness.workloads.tokens). A causal LM may train on real
tokens instead (`data = "text"` or a token file, training_harness.workloads.data): the text
corpus is bytes, so its vocab_size defaults to 256 there (the model's own tokenizer
plays no part; a token file must hold ids below vocab_size). The model is built from its config
in fp32 (master weights; amp casts); `hf:/folder` loads the folder's weights when
present. The loss is computed here from the logits, the same way for the whole model
and for a pipeline's last stage.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.errors import HarnessError
from training_harness.workloads import optional
from training_harness.workloads.base import Workload
from training_harness.workloads.data import check_name, is_synthetic
from training_harness.workloads.data import tokens as token_data
from training_harness.workloads.hf_config import HFSource, is_folder, load_config, model_class
from training_harness.workloads.hf_head import criterion_of, fused_head_loss
from training_harness.workloads.hf_moe import (
    aux_loss_coef,
    expert_groups,
    inactive_parameters,
)
from training_harness.workloads.hf_seq2seq import seq2seq_batch, stack_layers, start_id
from training_harness.workloads.tokens import IGNORE, masked, next_token

ATTENTION = ("eager", "sdpa")
MASK_FRACTION = 0.15


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions whose label is not IGNORE."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1),
                           ignore_index=IGNORE)


def set_attention(model: nn.Module, kind: str) -> int:
    """Switch a transformers model's attention to "sdpa", "flex_attention" for "flex",
    or "eager" for "explicit"; returns 1 when `model` is one (its own switch reaches
    every layer), else 0. A sparse pattern set already (strategies.sparse_attention)
    is kept: it replaces the attention whatever the kind."""
    switch = getattr(model, "set_attn_implementation", None)
    if switch is None or not hasattr(getattr(model, "config", None), "_attn_implementation"):
        return 0
    if str(model.config._attn_implementation).startswith("harness_sparse"):
        return 1
    switch({"sdpa": "sdpa", "flex": "flex_attention"}.get(kind, "eager"))
    return 1


class HFWorkload(Workload):
    """A transformers model from its config (or folder), with synthetic tokens."""

    def __init__(self, source: HFSource, seq_len: int, attn_implementation: str,
                 data: str = "synthetic"):
        self.source = source
        self.data = data
        self.config = source.config
        self.name = f"hf:{source.spec}"
        self.seq_len = seq_len
        self.attn_implementation = attn_implementation
        self.tokens_per_sample = seq_len
        self.vocab = int(self.config.vocab_size)

    @property
    def causal(self) -> bool:
        return self.source.task == "causal-lm"

    def build_model(self) -> nn.Module:
        cls = model_class(self.source)
        kwargs = dict(attn_implementation=self.attn_implementation, dtype=torch.float32)
        if self.source.weights and torch.get_default_device().type != "meta":
            return cls.from_pretrained(str(self.source.folder), config=self.config,
                                       local_files_only=True, **kwargs)
        return cls.from_config(self.config, **kwargs)

    @property
    def seq2seq(self) -> bool:
        return self.source.task == "seq2seq-lm"

    def _seq2seq(self, batch_size: int, index: int, device: Any, val: bool = False) -> Any:
        clean = None
        if not is_synthetic(self.data) and torch.device(device).type != "meta":
            clean, _ = token_data(self.data).next_token(batch_size, index, self.seq_len, "cpu",
                                                        val)
        return seq2seq_batch(clean, batch_size, index, self.seq_len, self.vocab,
                             start_id(self.config), device)

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        if self.seq2seq:
            return self._seq2seq(batch_size, index, device)
        if not is_synthetic(self.data):
            return token_data(self.data).next_token(batch_size, index, self.seq_len, device)
        if self.causal:
            return next_token(batch_size, index, self.seq_len, self.vocab, device)
        # Tokens below vocab - 1; the last id is the mask (the config's own when it has one).
        mask_id = getattr(self.config, "mask_token_id", None)
        mask_id = self.vocab - 1 if mask_id is None else int(mask_id)
        return masked(batch_size, index, self.seq_len, self.vocab - 1, mask_id,
                      MASK_FRACTION, device)

    def eval_batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        if is_synthetic(self.data):
            return super().eval_batch(batch_size, index, device)
        if self.seq2seq:
            return self._seq2seq(batch_size, index, device, True)
        return token_data(self.data).next_token(batch_size, index, self.seq_len, device, True)

    def data_info(self) -> dict[str, Any]:
        return super().data_info() if is_synthetic(self.data) else token_data(self.data).describe()

    def loss(self, model: nn.Module, batch: Any, loss_in_forward: bool = False) -> torch.Tensor:
        """Cross-entropy of the logits (of the head's input, fused with the head, under
        fused linear_cross_entropy: workloads.hf_head); a mixture of experts adds its
        router's auxiliary (load-balancing) loss as transformers does: times
        router_aux_loss_coef, when output_router_logits is on (the default here).
        `loss_in_forward` (a causal LM, strategies.liger): the model's forward takes the
        labels, already shifted, as shift_labels and returns the same mean cross-entropy
        (ignore index IGNORE) without making the logits (Liger's fused linear
        cross-entropy)."""
        if len(batch) == 3:  # an encoder-decoder: noisy source, teacher-forced decoder
            ids, decoder_ids, labels = batch
            if self.aux_coef and self._has_experts(model):  # an encoder-decoder MoE: its router
                # losses (encoder's and decoder's, z-loss too) come with its own loss,
                # the cross-entropy of the same labels at the same positions
                return model(input_ids=ids, decoder_input_ids=decoder_ids, labels=labels,
                             output_router_logits=True).loss
            out = model(input_ids=ids, decoder_input_ids=decoder_ids)
            loss = lm_loss(out.logits, labels)
        else:
            ids, labels = batch
            criterion = None if loss_in_forward else criterion_of(model)
            if criterion is not None:  # fused linear_cross_entropy: no logits (hf_head)
                out, loss = fused_head_loss(model, criterion, ids, labels)
            else:
                out = model(input_ids=ids,
                            **({"shift_labels": labels} if loss_in_forward else {}))
                loss = out.loss if loss_in_forward else lm_loss(out.logits, labels)
        aux = getattr(out, "aux_loss", None)
        if aux is not None and self.aux_coef:
            loss = loss + self.aux_coef * aux.to(loss.dtype)
        return loss

    def _has_experts(self, model: nn.Module) -> bool:
        """Whether the model has routed experts (a config may leave every layer dense:
        NLLB-MoE at 2 layers), looked up once."""
        if getattr(self, "_experts_seen", None) is None:
            self._experts_seen = bool(expert_groups(model))
        return self._experts_seen

    @property
    def aux_coef(self) -> float | None:
        """The router loss's weight where the model adds one: output_router_logits on,
        or an encoder-decoder MoE without that field (Switch Transformers), whose forward is
        then asked for them."""
        on = getattr(self.config, "output_router_logits", None)
        if on is None and not self.seq2seq or on is False:
            return None
        return aux_loss_coef(self.config)

    def flops_per_sample(self) -> float:
        """6N + 12·L·(heads·head_dim)·T per token (PaLM, appendix B), times T tokens
        (the attention term only where the config has attention heads). An
        encoder-decoder's N holds both stacks (each of the T source tokens meets the
        encoder's, each of the T target tokens the decoder's), and its attention counts
        the encoder's and decoder's self-attention and the cross-attention.

        A mixture of experts counts its active parameters: each routed expert group at
        k/E (experts per token over experts), the router and shared experts in full
        (training_harness.workloads.hf_moe).

        N counts the parameters that take part in a matmul: embedding lookups (token,
        position, token type) are counted out, except a token embedding tied to the LM
        head, which counts once, as the head.
        """
        with torch.device("meta"):
            model = self.build_model()
        heads_out = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
        lookups = {id(m.weight): m.weight.numel() for m in model.modules()
                   if isinstance(m, nn.Embedding) and id(m.weight) not in heads_out}
        n = sum(p.numel() for p in model.parameters()) - sum(lookups.values())
        n -= inactive_parameters(model, self.config)[0]  # MoE: the experts a token skips
        width = attention_width(self.config)
        if self.seq2seq:  # encoder self-, decoder self- and cross-attention, T x T each
            enc, dec = stack_layers(self.config)
            per_layer = width // max(1, _int_field(self.config, "num_hidden_layers") or 1)
            width = (enc + 2 * dec) * per_layer
        per_token = 6 * n + 12 * width * self.seq_len
        return float(per_token * self.seq_len)


def _int_field(config: Any, name: str) -> int | None:
    try:
        v = getattr(config, name, None)
    except Exception:  # a config whose attribute_map points at a field it lacks
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def attention_width(config: Any) -> int:
    """L·heads·head_dim of the attention's score and value matmuls: 0 for a model
    without attention heads in its config (state-space models: Mamba, RWKV)."""
    heads = _int_field(config, "num_attention_heads")
    layers = _int_field(config, "num_hidden_layers")
    if heads is None or layers is None:
        return 0
    hidden = _int_field(config, "hidden_size")
    head_dim = (_int_field(config, "head_dim") or _int_field(config, "d_kv")
                or (hidden // heads if hidden else 0))
    return layers * heads * head_dim


def _needs_vocab(config: Any, where: str) -> None:
    """A composite config (vision + text, audio + text) has its vocabulary in a sub-config:
    refused, naming the text model's own type where transformers has one."""
    try:
        vocab = getattr(config, "vocab_size", None)
    except Exception:
        vocab = None
    if isinstance(vocab, int) and vocab > 0:
        return
    subs = {k: v for k, v in vars(config).items() if hasattr(v, "model_type")
            and hasattr(v, "to_dict")}
    text = subs.get("text_config") or subs.get("decoder") or next(
        (v for k, v in subs.items() if "text" in k), None)
    name = type(config).__name__
    if text is not None:
        raise HarnessError(
            f"{where}: {name} is a composite model ({', '.join(subs)}) whose vocabulary lies "
            f"in its {'text_config' if 'text_config' in subs else 'sub-configs'}; train its "
            f"language model as hf:{text.model_type} instead")
    raise HarnessError(f"{where}: {name} has no vocab_size; set vocab_size in [workload]")


def build_hf(spec: str, args: dict[str, Any]) -> HFWorkload:
    """`hf:<spec>` with its [workload] arguments: config fields, plus seq_len,
    attn_implementation ("eager" or "sdpa"), task ("auto", "causal-lm", "masked-lm",
    "seq2seq-lm")
    and data ("synthetic", "text" or a token file)."""
    fields = dict(args)
    seq_len = fields.pop("seq_len", 128)
    attn = fields.pop("attn_implementation", "eager")
    task = fields.pop("task", "auto")
    data = fields.pop("data", "synthetic")
    where = f"workload 'hf:{spec}'"
    if type(seq_len) is not int or seq_len < 1:
        raise HarnessError(f"{where}: seq_len must be a whole number of 1 or more")
    if attn not in ATTENTION:
        raise HarnessError(f"{where}: attn_implementation '{attn}' is not one of "
                           f"{', '.join(ATTENTION)}")
    optional.transformers()
    if data == "text" and not is_folder(spec):
        fields.setdefault("vocab_size", 256)  # the corpus is bytes
    source = load_config(spec, fields, task)
    # a config that can return router logits has a router loss: trained, as MoEs do
    if hasattr(source.config, "output_router_logits") and "output_router_logits" not in fields:
        source.config.output_router_logits = True
    _needs_vocab(source.config, where)
    longest = getattr(source.config, "max_position_embeddings", None)
    if isinstance(longest, int) and 0 < longest < seq_len:  # XLNet: -1, no limit
        raise HarnessError(f"{where}: seq_len {seq_len} is longer than the model's "
                           f"max_position_embeddings ({longest}); lower seq_len or raise "
                           "max_position_embeddings (n_positions for gpt2)")
    if not is_synthetic(data):
        check_name(data, "tokens", "[workload]")
        if source.task == "masked-lm":
            raise HarnessError(f"{where}: data = '{data}' trains causal LMs only (next-token "
                               "prediction), and encoder-decoders (copy with noise); use "
                               "data = 'synthetic' for a masked LM")
        token_data(data).check(seq_len, int(source.config.vocab_size), "[workload]",
                               "vocab_size")
    return HFWorkload(source, seq_len, attn, data)
