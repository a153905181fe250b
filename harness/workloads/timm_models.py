"""timm's image models as workloads: `timm:resnet18`, `timm:vit_tiny_patch16_224` ...

In a plan:

    [workload]
    name = "timm:convnext_atto"
    num_classes = 1000
    image_size = 224   # default: the model's own input size (its pretrained config's)
    # any other keyword of timm.create_model for it, e.g. drop_path_rate = 0.1

Untrained (`pretrained = False`, nothing downloaded), synthetic images with learnable
per-class patterns (training_harness.workloads.vision.synthetic_images), cross-entropy. Models
built for one input size (ViTs, Swin, MLP-Mixer: timm's `fixed_input_size`) are built
for `image_size` (`img_size=`), so their position embeddings and windows follow it.
The blocks the strategies act on are the ones timm's own group matcher names
(training_harness.workloads.blocks): a ResNet's BasicBlocks, a ViT's `blocks`, ConvNeXt's and
Swin's per-stage blocks, an EfficientNet's inverted residuals. FLOPs are counted with
torch's FLOP counter (once per arguments, see training_harness.measure.prepare).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from training_harness.core.config import did_you_mean
from training_harness.core.errors import HarnessError
from training_harness.workloads import optional
from training_harness.workloads.vision import LibraryClassifier, whole_numbers

EXAMPLES = "resnet18, vit_tiny_patch16_224, convnext_atto, efficientnet_b0"
BUILD_ERRORS = (TypeError, ValueError, AssertionError, KeyError, RuntimeError)


def timm() -> Any:
    return optional.require("timm", "timm")


class TimmWorkload(LibraryClassifier):
    def create(self) -> nn.Module:
        return timm().create_model(self.model, pretrained=False, num_classes=self.num_classes,
                                   in_chans=self.channels, **self.kwargs)


def build_timm(name: str, args: dict[str, Any]) -> TimmWorkload:
    """`timm:<name>` with num_classes, image_size, in_chans and create_model's keywords."""
    lib = timm()
    where = f"workload 'timm:{name}'"
    if name.startswith("hf-hub:") or "/" in name:
        raise HarnessError(f"{where}: models from the Hugging Face hub are not downloaded "
                           "here; name the architecture, e.g. timm:resnet18 (trained from "
                           "its initialisation)")
    if not lib.is_model(name):
        known = lib.list_models()
        raise HarnessError(f"{where}: timm {lib.__version__} has no model '{name}'"
                           f"{did_you_mean(name, known)}; e.g. {EXAMPLES} "
                           "(timm.list_models() lists them)")
    kwargs = dict(args)
    for key in ("pretrained", "pretrained_cfg", "checkpoint_path"):
        if key in kwargs:
            raise HarnessError(f"{where}: '{key}' is not taken: the model is trained from "
                               "its initialisation, nothing is downloaded; drop it")
    cfg = lib.models.get_pretrained_cfg(name)
    default_size = int(cfg.input_size[-1]) if cfg is not None and cfg.input_size else 224
    fixed = bool(cfg is not None and cfg.fixed_input_size)
    num_classes = kwargs.pop("num_classes", 1000)
    image_size = kwargs.pop("image_size", default_size)
    channels = kwargs.pop("in_chans", 3)
    whole_numbers(where, num_classes=num_classes, image_size=image_size, in_chans=channels)
    if fixed and "img_size" not in kwargs:
        kwargs["img_size"] = image_size  # its position embeddings / windows follow it
    workload = TimmWorkload(f"timm:{name}", num_classes, image_size, kwargs, channels)
    try:
        workload.build_on_meta(where, BUILD_ERRORS)
    except HarnessError as e:
        if not fixed or "img_size" in args or "img_size" not in str(e):
            raise
        kwargs.pop("img_size")  # a fixed-size model that takes no img_size: its own size
        if image_size != default_size:
            raise HarnessError(f"{where}: this model is built for {default_size} px images "
                               f"only; drop image_size or set it to {default_size}") from None
        workload.build_on_meta(where, BUILD_ERRORS)
    workload.check_forward(where, "set image_size to one it takes, e.g. its default "
                                  f"{default_size}")
    return workload

