"""A byte-level text corpus that every Python install carries, split by a fixed rule.

The text is the standard library's `pydoc_data.topics` (the help() pages on the
language: about 465k bytes of English and code), its topics in sorted order, each
UTF-8 encoded and followed by a blank line. Tokens are bytes: a vocabulary of 256.

The split cuts the stream into chunks of CHUNK bytes and holds every
VALIDATION_EVERY-th chunk out (chunks 9, 19, 29, ...): about 10% of the text, spread
over the whole corpus rather than one end of the alphabet, and the same on every
machine with the same Python. A validation window never crosses a chunk's edge, so no
held-out byte is ever a training target. `digest` names the exact bytes for the record
(another Python may carry other help pages).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

CHUNK = 4096
VALIDATION_EVERY = 10


@dataclass(frozen=True)
class Split:
    """A token stream cut into train and held-out parts."""

    train: np.ndarray  # 1-D, every training chunk in order
    validation: list[np.ndarray]  # the held-out chunks, each windowed on its own
    source: str
    digest: str  # sha256 of the whole stream before the split, first 16 hex digits

    @property
    def validation_tokens(self) -> int:
        return sum(len(c) for c in self.validation)


def corpus_bytes() -> bytes:
    """The whole corpus, before the split."""
    from pydoc_data.topics import topics

    return b"".join(topics[key].encode("utf-8") + b"\n\n" for key in sorted(topics))


def split_stream(tokens: np.ndarray, source: str) -> Split:
    """The fixed rule: chunk i (of CHUNK tokens) is held out when i % 10 == 9."""
    n_chunks = -(-len(tokens) // CHUNK)
    held = [i for i in range(n_chunks) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1]
    kept = [i for i in range(n_chunks) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1]
    train = np.concatenate([tokens[i * CHUNK:(i + 1) * CHUNK] for i in kept])
    validation = [tokens[i * CHUNK:(i + 1) * CHUNK] for i in held]
    digest = hashlib.sha256(np.ascontiguousarray(tokens).tobytes()).hexdigest()[:16]
    return Split(train=train, validation=validation, source=source, digest=digest)


@functools.cache
def text_split() -> Split:
    """The standard library's help text as bytes, split (built once per process)."""
    data = np.frombuffer(corpus_bytes(), dtype=np.uint8)
    return split_stream(data, "pydoc_data.topics (Python's help pages), bytes")
