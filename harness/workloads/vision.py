"""Image classification workloads: a small ResNet and a ViT on synthetic images, or on
real ones (`data = "digits"` or an .npz file: training_harness.workloads.data).

Images are NCHW float32, labels int64. Every batch is drawn on the CPU from a
generator seeded with the batch index, then moved, so batch `index` is the same
in every process and on every device. The images are noise plus a coarse
per-class pattern, so the labels can be learnt (a loss curve means something),
not only memorised.

In a plan:

    [workload]
    name = "vit"
    layers = 12
    hidden = 384
    heads = 6
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.config import bounded, from_table
from training_harness.core.errors import HarnessError
from training_harness.workloads.base import TransformerShape, Workload
from training_harness.workloads.data import check_name, images, is_synthetic

# The per-class patterns are the same for every batch: drawn from this seed at
# this resolution, then scaled up to the image size.
_PATTERN_SEED = 0x5EED
_PATTERN_SIZE = 4
_PATTERN_SCALE = 0.5


def synthetic_images(
    batch_size: int,
    index: int,
    *,
    channels: int,
    image_size: int,
    num_classes: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch `index` of (images [B, C, H, W] float32, labels [B] int64)."""
    shape = (batch_size, channels, image_size, image_size)
    if torch.device(device).type == "meta":  # sizes only: nothing to draw
        return (
            torch.empty(shape, dtype=torch.float32, device="meta"),
            torch.empty(batch_size, dtype=torch.int64, device="meta"),
        )
    g = torch.Generator(device="cpu").manual_seed(index)
    labels = torch.randint(0, num_classes, (batch_size,), generator=g, device="cpu")
    noise = torch.randn(shape, generator=g, device="cpu")
    p = torch.Generator(device="cpu").manual_seed(_PATTERN_SEED)
    patterns = torch.randn(
        num_classes, channels, _PATTERN_SIZE, _PATTERN_SIZE, generator=p, device="cpu"
    )
    signal = F.interpolate(patterns[labels], size=(image_size, image_size), mode="nearest")
    images = noise + _PATTERN_SCALE * signal
    return images.to(device), labels.to(device)


class LibraryClassifier(Workload):
    """A model library's image classifier (`torchvision:<name>`, `timm:<name>`): synthetic
    images of its size and classes (`synthetic_images`), cross-entropy on its logits.
    Subclasses build the model."""

    def __init__(self, name: str, num_classes: int, image_size: int, kwargs: dict[str, Any],
                 channels: int = 3):
        self.name, self.model = name, name.partition(":")[2]
        self.num_classes, self.image_size, self.channels = num_classes, image_size, channels
        self.kwargs = kwargs  # the builder's own keywords

    @abstractmethod
    def create(self) -> nn.Module:
        """The library's model, on the current default device."""

    def build_on_meta(self, where: str, errors: tuple[type[Exception], ...]) -> None:
        """The builder's own checks, nothing allocated; a refusal (`errors`) is one line."""
        try:
            with torch.device("meta"):
                self.build_model()
        except errors as e:
            raise HarnessError(f"{where}: {one_line(e)}; fix the [workload] arguments") from None

    def build_model(self) -> nn.Module:
        try:
            return self.create()
        except (NotImplementedError, RuntimeError) as e:
            if torch.get_default_device().type != "meta" or "meta" not in str(e):
                raise
        # A builder that reads tensor values (torchvision's RegNet computes its widths
        # with tensors) cannot run on the meta device: built on the CPU, then moved.
        with torch.device("cpu"):
            model = self.create()
        return model.to("meta")

    def check_forward(self, where: str, sizes: str) -> None:
        """A HarnessError, in one line, when the model cannot take these images: a
        forward of two on the meta device, nothing allocated. An op the meta device
        cannot run is not the user's mistake: that forward is left to the trial."""
        with torch.device("meta"):
            model = self.build_model()
        images, _ = self.batch(2, 0, "meta")
        try:
            model(images)
        except Exception as e:
            text = one_line(e)
            if "meta" in text:
                return
            raise HarnessError(f"{where}: it does not run on {self.image_size} px images "
                               f"({text}); {sizes}") from None

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        return synthetic_images(batch_size, index, channels=self.channels,
                                image_size=self.image_size, num_classes=self.num_classes,
                                device=device)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        images, labels = batch
        out = model(images)
        logits = getattr(out, "logits", out)  # GoogLeNet / Inception return a named tuple
        return F.cross_entropy(logits, labels)


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (whitespace runs joined), at most `limit` long."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole_numbers(where: str, **values: Any) -> None:
    """A HarnessError unless each value is a whole number of 1 or more."""
    for key, value in values.items():
        if type(value) is not int or value < 1:
            raise HarnessError(f"{where}: {key} must be a whole number of 1 or more, "
                               f"got {value!r}")


class ImageClassification(Workload):
    """What ResNet and ViT share: synthetic image batches (`synthetic_images`) with the
    sizes of `self.config` (channels, image_size, num_classes), and cross-entropy."""

    config: Any

    def _check_data(self) -> None:
        self.data = self.config.data
        check_name(self.data, "images", "[workload]")
        if not is_synthetic(self.data):
            images(self.data).check(self.config.num_classes, "[workload]")

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        c = self.config
        if is_synthetic(c.data) or torch.device(device).type == "meta":  # meta: sizes only
            return synthetic_images(
                batch_size, index, channels=c.channels, image_size=c.image_size,
                num_classes=c.num_classes, device=device,
            )
        return self._real(batch_size, index, device, images(c.data).train_batch)

    def eval_batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        if is_synthetic(self.config.data) or torch.device(device).type == "meta":
            return super().eval_batch(batch_size, index, device)
        return self._real(batch_size, index, device, images(self.config.data).eval_batch)

    def _real(self, batch_size: int, index: int, device: torch.device | str, draw: Any) -> Any:
        x, y = draw(batch_size, index, self.config.channels, self.config.image_size)
        return x.to(device), y.to(device)

    def data_info(self) -> dict[str, Any]:
        if is_synthetic(self.config.data):
            return super().data_info()
        return images(self.config.data).describe()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels)


def _positive(cfg: Any, where: str, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise HarnessError(f"{where}.{name}: must be 1 or more, got {getattr(cfg, name)}")


# --- ResNet -----------------------------------------------------------------


@dataclass
class ResNetConfig:
    """A CIFAR-style ResNet: 3x3 stem, stages of basic blocks, global pool, linear head.

    Stage i has `blocks_per_stage` blocks of width `widths[i]`; every stage after
    the first halves the resolution in its first block.
    """

    widths: tuple[int, ...] = (32, 64, 128)
    blocks_per_stage: int = bounded(2, 1, 1024)
    image_size: int = bounded(32, 1, 2**16)
    num_classes: int = bounded(10, 1, 2**24)
    channels: int = bounded(3, 1, 4096)
    data: str = "synthetic"  # or "digits" or an .npz image set (training_harness.workloads.data)

    def validate(self, where: str) -> None:
        if not 1 <= len(self.widths) <= 64:
            raise HarnessError(f"{where}.widths: give 1 to 64 stage widths")
        for i, w in enumerate(self.widths):
            if not 1 <= w <= 2**20:
                raise HarnessError(f"{where}.widths[{i}]: must be between 1 and 1048576, got {w}")
        _positive(self, where, "blocks_per_stage", "image_size", "num_classes", "channels")


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual; a 1x1 conv-BN shortcut when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.channels, cfg.widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(cfg.widths[0]),
            nn.ReLU(),
        )
        blocks = []
        width = cfg.widths[0]
        for stage, out in enumerate(cfg.widths):
            for i in range(cfg.blocks_per_stage):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(width, out, stride))
                width = out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(width, cfg.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class ResNetWorkload(ImageClassification):
    name = "resnet"

    def __init__(self, config: ResNetConfig | None = None) -> None:
        self.config = config or ResNetConfig()
        self.config.validate("[workload]")
        self._check_data()

    def build_model(self) -> nn.Module:
        return ResNet(self.config)


def build_resnet(**args: Any) -> Workload:
    """The "resnet" workload from its [workload] arguments (see ResNetConfig)."""
    return ResNetWorkload(from_table(ResNetConfig, args, "[workload]"))


# --- ViT --------------------------------------------------------------------


@dataclass
class ViTConfig:
    """A ViT: Conv2d patch embedding, class token, pre-norm blocks, head on the class token."""

    layers: int = bounded(6, 1, 4096)
    hidden: int = bounded(256, 1, 2**20)
    heads: int = bounded(8, 1, 4096)
    mlp_ratio: float = bounded(4.0, 1e-3, 256)
    patch_size: int = bounded(4, 1, 2**16)
    image_size: int = bounded(32, 1, 2**16)
    num_classes: int = bounded(10, 1, 2**24)
    channels: int = bounded(3, 1, 4096)
    dropout: float = bounded(0.0, 0.0, 0.99)
    data: str = "synthetic"  # or "digits" or an .npz image set (training_harness.workloads.data)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def ffn_hidden(self) -> int:
        return round(self.mlp_ratio * self.hidden)

    def validate(self, where: str) -> None:
        _positive(self, where, "layers", "hidden", "heads", "patch_size", "image_size",
                  "num_classes", "channels")
        if self.hidden % self.heads:
            raise HarnessError(
                f"{where}.hidden: {self.hidden} is not divisible by heads ({self.heads}); "
                "make hidden a multiple of heads"
            )
        if self.image_size % self.patch_size:
            raise HarnessError(
                f"{where}.image_size: {self.image_size} is not divisible by patch_size "
                f"({self.patch_size}); make image_size a multiple of patch_size"
            )
        if not (math.isfinite(self.mlp_ratio) and self.ffn_hidden >= 1):
            raise HarnessError(f"{where}.mlp_ratio: must be above 0, got {self.mlp_ratio}")
        if not 0.0 <= self.dropout < 1.0:
            raise HarnessError(f"{where}.dropout: must be in [0, 1), got {self.dropout}")


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(b, t, h))


class ViTBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn_hidden: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, dropout)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, ffn_hidden), nn.GELU(), nn.Linear(ffn_hidden, hidden)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(cfg.channels, cfg.hidden, cfg.patch_size, cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches + 1, cfg.hidden))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            ViTBlock(cfg.hidden, cfg.heads, cfg.ffn_hidden, cfg.dropout) for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # [B, patches, hidden]
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.drop(torch.cat([cls, x], dim=1) + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class ViTWorkload(ImageClassification):
    name = "vit"

    def __init__(self, config: ViTConfig | None = None) -> None:
        self.config = c = config or ViTConfig()
        c.validate("[workload]")
        self._check_data()
        self.shape = TransformerShape(
            layers=c.layers, hidden=c.hidden, heads=c.heads, seq_len=c.num_patches + 1,
            vocab=c.num_classes, ffn_hidden=c.ffn_hidden, dropout=c.dropout,
        )

    def build_model(self) -> nn.Module:
        return ViT(self.config)


def build_vit(**args: Any) -> Workload:
    """The "vit" workload from its [workload] arguments (see ViTConfig)."""
    return ViTWorkload(from_table(ViTConfig, args, "[workload]"))
