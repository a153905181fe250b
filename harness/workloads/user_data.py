"""A user's own data: `data = "/path/..."` in [workload].

Tokens (gpt):
    a folder with train.bin and val.bin     nanoGPT's layout: uint16 token ids, split as given
    file.bin                                uint16 token ids (nanoGPT's format)
    file.npy                                1-D integer token ids, any integer dtype
    file.txt                                UTF-8 text as bytes (vocab 256)
  a single file is split by the corpus's fixed rule (every 10th chunk of 4,096 tokens
  held out, training_harness.workloads.corpus.split_stream).
Images (resnet, vit, mlp):
    file.npz                                arrays `images` [N, H, W] or [N, C, H, W] and
                                            `labels` [N]; image i held out when i % 5 == 4
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from training_harness.core.errors import HarnessError
from training_harness.workloads.corpus import Split, split_stream
from training_harness.workloads.image_split import ImageSplit


def _read_tokens(path: Path) -> np.ndarray:
    if path.suffix == ".bin":
        return np.memmap(path, dtype=np.uint16, mode="r")
    if path.suffix == ".txt":
        return np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if path.suffix == ".npy":
        data = np.load(path, mmap_mode="r")
        if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
            raise HarnessError(f"[workload].data: {path} holds {data.dtype} of shape "
                               f"{data.shape}; save a 1-D array of integer token ids")
        return data
    raise HarnessError(f"[workload].data: {path}: use a .bin (uint16), .npy or .txt token "
                       "file, or a folder with train.bin and val.bin")


def token_split(path: Path) -> Split:
    if not path.exists():
        raise HarnessError(f"[workload].data: {path} does not exist; give 'synthetic', 'text' "
                           "or the path of your token file")
    if path.is_dir():
        train, val = path / "train.bin", path / "val.bin"
        if not (train.is_file() and val.is_file()):
            raise HarnessError(f"[workload].data: the folder {path} needs train.bin and val.bin")
        t, v = np.asarray(_read_tokens(train)), np.asarray(_read_tokens(val))
        digest = hashlib.sha256(t.tobytes() + v.tobytes()).hexdigest()[:16]
        return Split(train=t, validation=[v], source=str(path), digest=digest)
    return split_stream(np.asarray(_read_tokens(path)), str(path))


def image_split(path: Path) -> ImageSplit:
    if path.suffix != ".npz" or not path.is_file():
        raise HarnessError(f"[workload].data: {path}: give 'synthetic', 'digits' or an .npz "
                           "file with arrays 'images' and 'labels'")
    with np.load(path) as f:
        if "images" not in f or "labels" not in f:
            raise HarnessError(f"[workload].data: {path} needs arrays 'images' and 'labels'")
        pixels, labels = np.asarray(f["images"], np.float32), np.asarray(f["labels"], np.int64)
    if pixels.ndim == 3:
        pixels = pixels[:, None]
    if pixels.ndim != 4 or len(pixels) != len(labels) or len(labels) < 2:
        raise HarnessError(f"[workload].data: {path}: images must be [N, H, W] or [N, C, H, W] "
                           f"with one label each (got {pixels.shape} and {labels.shape})")
    digest = hashlib.sha256(pixels.tobytes() + labels.tobytes()).hexdigest()[:16]
    x = torch.from_numpy(pixels)
    x = (x - x.mean()) / x.std().clamp_min(1e-6)
    y = torch.from_numpy(labels)
    held = torch.arange(len(y)) % 5 == 4
    return ImageSplit(train_x=x[~held], train_y=y[~held], val_x=x[held], val_y=y[held],
                      source=str(path), digest=digest)
