"""Encoder-decoders (T5, BART, Marian, Pegasus ...) as workloads: copy with noise.

The encoder reads a sequence with 15% of its tokens replaced by random ones; the decoder
writes the clean sequence, teacher-forced: its inputs are the clean tokens shifted right
behind the config's decoder_start_token_id. The clean sequences are the synthetic
recurrence (training_harness.workloads.tokens) or, with `data = "text"` or a token file, real
tokens; either way the task is learnable (denoising), and both stacks see `seq_len`
tokens. The loss is the cross-entropy of the decoder's logits over every position.
"""

from __future__ import annotations

from typing import Any

import torch

NOISE = 0.15


def start_id(config: Any) -> int:
    """The token the decoder starts from (T5: pad, BART: eos), 0 where none is set."""
    for name in ("decoder_start_token_id", "pad_token_id", "bos_token_id"):
        v = getattr(config, name, None)
        if isinstance(v, int) and 0 <= v < int(config.vocab_size):
            return v
    return 0


def copy_with_noise(clean: torch.Tensor, index: int, vocab: int, start: int,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(encoder inputs, decoder inputs, labels) from a [batch, seq_len] clean CPU batch:
    the inputs are the clean tokens with NOISE of them replaced (the same count in
    every row, so a micro-batch's loss is the mean of its halves')."""
    g = torch.Generator().manual_seed(9_000_011 * (index + 1))
    b, t = clean.shape
    k = max(1, round(NOISE * t))
    where = torch.rand(b, t, generator=g).argsort(dim=1)[:, :k]
    noisy = clean.clone()
    noisy.scatter_(1, where, torch.randint(vocab, (b, k), generator=g))
    decoder = torch.cat([torch.full((b, 1), start, dtype=clean.dtype), clean[:, :-1]], dim=1)
    return noisy, decoder, clean.clone()


def seq2seq_batch(clean: torch.Tensor | None, batch_size: int, index: int, seq_len: int,
                  vocab: int, start: int, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """The batch of `clean` sequences (the synthetic ones when None) on `device`."""
    if torch.device(device).type == "meta":
        ids = torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")
        return ids, torch.empty_like(ids), torch.empty_like(ids)
    if clean is None:
        from training_harness.workloads.tokens import sequences

        clean = sequences(batch_size, index, seq_len, vocab)
    return tuple(x.to(device) for x in copy_with_noise(clean.cpu(), index, vocab, start))


def stack_layers(config: Any) -> tuple[int, int]:
    """(encoder layers, decoder layers) by the names configs use."""
    def first(*names: str) -> int:
        for n in names:
            v = getattr(config, n, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        return 0

    enc = first("encoder_layers", "num_layers", "num_hidden_layers")
    dec = first("decoder_layers", "num_decoder_layers") or enc
    return enc, dec
