"""Seeded synthetic token batches for language models: next-token and masked-LM.

The text is learnable, so a loss curve means something: each sequence follows
x[t+1] = (5·x[t] + 17) mod V from a random start, with 10% of tokens replaced by
noise (the gpt workload's data). Batch `index` is drawn on the CPU from a generator
seeded with it, then moved: the same in every process and on every device.
"""

from __future__ import annotations

import torch

IGNORE = -100  # label of a position that takes no part in the loss (torch's default)


def sequences(batch_size: int, index: int, length: int, vocab: int) -> torch.Tensor:
    """[batch_size, length] int64 token ids below `vocab`, batch `index`'s."""
    g = torch.Generator().manual_seed(1_000_003 * (index + 1))
    tokens = torch.randint(vocab, (batch_size, 1), generator=g).expand(-1, length).clone()
    for t in range(1, length):
        tokens[:, t] = (5 * tokens[:, t - 1] + 17) % vocab
    noise = torch.rand(tokens.shape, generator=g) < 0.1
    tokens[noise] = torch.randint(vocab, (int(noise.sum()),), generator=g)
    return tokens


def next_token(batch_size: int, index: int, seq_len: int, vocab: int,
               device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): targets are the inputs shifted one token left."""
    if torch.device(device).type == "meta":  # sizes only: nothing to draw
        ids = torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")
        return ids, torch.empty_like(ids)
    tokens = sequences(batch_size, index, seq_len + 1, vocab).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def masked(batch_size: int, index: int, seq_len: int, vocab: int, mask_id: int,
           fraction: float, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with `mask_id` at the masked positions, labels: the original token there,
    IGNORE elsewhere). Every sequence masks the same number of positions, so the mean
    loss of a batch is the mean of its micro-batches' (accumulation stays exact)."""
    if torch.device(device).type == "meta":
        ids = torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")
        return ids, torch.empty_like(ids)
    tokens = sequences(batch_size, index, seq_len, vocab)
    g = torch.Generator().manual_seed(7_000_009 * (index + 1))
    k = max(1, round(fraction * seq_len))
    where = torch.rand(batch_size, seq_len, generator=g).argsort(dim=1)[:, :k]
    picked = torch.zeros_like(tokens, dtype=torch.bool).scatter_(1, where, True)
    labels = torch.where(picked, tokens, IGNORE)
    inputs = torch.where(picked, mask_id, tokens)
    return inputs.to(device), labels.to(device)
