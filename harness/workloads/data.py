"""Real data for the built-in workloads: `data = "synthetic" | "text" | "digits" | a path`.

    synthetic   the workload's own seeded batches (the default; nothing read)
    text        the byte-level corpus of Python's help pages (training_harness.workloads.corpus)
    digits      scikit-learn's bundled 8x8 digits (the `digits` extra; `digits_split`)
    a path      a user's token file or folder, or an image set
    (training_harness.workloads.user_data)

Training batch `index` is drawn from a generator seeded with the index, as the
synthetic batches are: the same in every process, for every micro-batch size and
layout, so techniques that leave the maths alone see the same data. Validation
batches are fixed windows (images) of the held-out part, in order: batch `index` of
size B holds held-out samples index*B ... index*B + B - 1, wrapping round.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training_harness.core.errors import HarnessError
from training_harness.workloads.corpus import Split, text_split
from training_harness.workloads.image_split import ImageSplit
from training_harness.workloads.optional import require


def is_synthetic(data: str) -> bool:
    return data == "synthetic"


def check_name(data: str, kind: str, where: str) -> None:
    """Refuse a named data set the workload cannot take (a path is read later)."""
    wants = {"tokens": "text", "images": "digits"}[kind]
    other = {"tokens": "digits", "images": "text"}[kind]
    if data == other:
        raise HarnessError(f"{where}.data: '{data}' is not {kind}; use 'synthetic', "
                           f"'{wants}' or a path to your own {kind}")
    if not data:
        raise HarnessError(f"{where}.data: give 'synthetic', '{wants}' or a path")


# --- tokens -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # hashed by identity: windows() is cached
class TokenData:
    split: Split

    def describe(self) -> dict[str, object]:
        s = self.split
        return {"source": s.source, "digest": s.digest, "train_tokens": len(s.train),
                "validation_tokens": s.validation_tokens}

    def check(self, seq_len: int, vocab: int, where: str, vocab_key: str = "vocab") -> None:
        s = self.split
        top = self.top_id()
        if top >= vocab:
            raise HarnessError(f"{where}.{vocab_key}: {s.source} has token ids up to {top}; "
                               f"set {vocab_key} to at least {top + 1}")
        if len(s.train) <= seq_len + 1:
            raise HarnessError(f"{where}.seq_len: {seq_len} is longer than the training text "
                               f"({len(s.train)} tokens); use a shorter seq_len")
        if not self.windows(seq_len):
            longest = max((len(c) for c in s.validation), default=0)
            raise HarnessError(f"{where}.seq_len: {seq_len} + 1 tokens do not fit in a held-out "
                               f"chunk ({longest} tokens); use seq_len below {longest}")

    @functools.cache  # noqa: B019 (one per data set, for the process's life)
    def top_id(self) -> int:
        s = self.split
        return max(int(s.train.max(initial=0)), *(int(c.max(initial=0)) for c in s.validation))

    @functools.cache  # noqa: B019 (one per data set and length, for the process's life)
    def windows(self, seq_len: int) -> list[tuple[int, int]]:
        """(chunk, start) of each held-out window of seq_len + 1 tokens, in order."""
        return [(c, start) for c, chunk in enumerate(self.split.validation)
                for start in range(0, len(chunk) - seq_len, seq_len)]

    def train_batch(self, batch_size: int, index: int, seq_len: int) -> torch.Tensor:
        """[batch_size, seq_len + 1] int64: windows at starts drawn with seed `index`."""
        train = torch.from_numpy(self.split.train)
        g = torch.Generator().manual_seed(1_000_003 * (index + 1))
        starts = torch.randint(len(train) - seq_len, (batch_size, 1), generator=g)
        return train[starts + torch.arange(seq_len + 1)].long()

    def eval_batch(self, batch_size: int, index: int, seq_len: int) -> torch.Tensor:
        wins = self.windows(seq_len)
        rows = [wins[(index * batch_size + i) % len(wins)] for i in range(batch_size)]
        chunks = self.split.validation
        return torch.stack([torch.from_numpy(chunks[c][s:s + seq_len + 1].astype(np.int64))
                            for c, s in rows])

    def next_token(self, batch_size: int, index: int, seq_len: int, device: torch.device | str,
                   held_out: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) for a causal LM: training batch `index` (or held-out batch
        `index`), the targets the inputs shifted one token left."""
        if torch.device(device).type == "meta":  # sizes only: nothing to read
            ids = torch.empty(batch_size, seq_len, dtype=torch.int64, device="meta")
            return ids, torch.empty_like(ids)
        draw = self.eval_batch if held_out else self.train_batch
        rows = draw(batch_size, index, seq_len).to(device)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


@functools.cache
def tokens(data: str) -> TokenData:
    if data == "text":
        return TokenData(text_split())
    from training_harness.workloads.user_data import token_split

    return TokenData(token_split(Path(data)))


# --- images -----------------------------------------------------------------


@functools.cache
def images(data: str) -> ImageSplit:
    if data == "digits":
        return digits_split()
    from training_harness.workloads.user_data import image_split

    return image_split(Path(data))


def digits_split() -> ImageSplit:
    """scikit-learn's bundled `digits` (1,797 8x8 greyscale digits, shipped inside the
    package, no download), split by a fixed rule: image i is held out when i % 5 == 4
    (359 validation images, 1,438 training images). Pixels (0 to 16) are scaled to
    about zero mean and unit spread; the vision workloads resize them to their
    image_size and repeat the grey channel."""
    datasets = require("sklearn.datasets", "digits")
    bunch = datasets.load_digits()
    pixels = np.asarray(bunch.images, dtype=np.float32)  # [N, 8, 8], 0..16
    labels = np.asarray(bunch.target, dtype=np.int64)
    digest = hashlib.sha256(pixels.tobytes() + labels.tobytes()).hexdigest()[:16]
    x = torch.from_numpy((pixels / 16.0 - 0.3) / 0.4).unsqueeze(1)  # mean ~0.3, spread ~0.4
    y = torch.from_numpy(labels)
    held = torch.arange(len(y)) % 5 == 4
    return ImageSplit(train_x=x[~held], train_y=y[~held], val_x=x[held], val_y=y[held],
                      source="scikit-learn digits (8x8)", digest=digest)
