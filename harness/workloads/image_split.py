"""An image set split into train and held-out images, and its batches.

Images are [N, C, H, W] float32 (about zero mean, unit spread), labels [N] int64.
Training batch `index` draws its images with a generator seeded with the index;
held-out batch `index` of size B is images index*B ... index*B + B - 1, wrapping round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training_harness.core.errors import HarnessError


@dataclass(frozen=True)
class ImageSplit:
    """Images [N, C, H, W] float32 (about zero mean, unit spread) and labels [N] int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    source: str
    digest: str

    @property
    def classes(self) -> int:
        return int(max(self.train_y.max(), self.val_y.max())) + 1

    def describe(self) -> dict[str, object]:
        return {"source": self.source, "digest": self.digest, "train_images": len(self.train_y),
                "validation_images": len(self.val_y)}

    def check(self, num_classes: int, where: str) -> None:
        if self.classes > num_classes:
            raise HarnessError(f"{where}.num_classes: {self.source} has {self.classes} classes; "
                               f"set num_classes to at least {self.classes}")

    def train_batch(self, batch_size: int, index: int, channels: int | None = None,
                    image_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        n = len(self.train_y)
        pick = (torch.randperm(n, generator=g)[:batch_size] if batch_size <= n
                else torch.randint(n, (batch_size,), generator=g))
        return _fit(self.train_x[pick], channels, image_size), self.train_y[pick]

    def eval_batch(self, batch_size: int, index: int, channels: int | None = None,
                   image_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        pick = (torch.arange(batch_size) + index * batch_size) % len(self.val_y)
        return _fit(self.val_x[pick], channels, image_size), self.val_y[pick]


def _fit(x: torch.Tensor, channels: int | None, image_size: int | None) -> torch.Tensor:
    """The workload's shape: channels repeated (grey to RGB), resized bilinearly (None:
    as stored)."""
    channels, image_size = channels or x.shape[1], image_size or x.shape[-1]
    if x.shape[1] != channels:
        if x.shape[1] != 1:
            raise HarnessError(f"[workload].channels: the images have {x.shape[1]} channels; "
                               f"set channels = {x.shape[1]}")
        x = x.expand(-1, channels, -1, -1)
    if x.shape[-1] != image_size or x.shape[-2] != image_size:
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear",
                                            align_corners=False)
    return x.contiguous()
