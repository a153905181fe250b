"""torchvision's classification models as workloads: `torchvision:resnet50`, `vit_b_16` ...

In a plan:

    [workload]
    name = "torchvision:resnet50"
    num_classes = 1000
    image_size = 224
    # any other keyword of the model's builder, e.g. dropout = 0.2 for efficientnet_b0

Untrained weights (no download), synthetic images with learnable per-class patterns
(training_harness.workloads.vision.synthetic_images), cross-entropy. The blocks the strategies
act on are found (training_harness.workloads.blocks): ResNet's Bottlenecks over its four stages,
a ViT's encoder layers, ConvNeXt's CNBlocks. FLOPs are counted with torch's FLOP
counter (once per arguments, see training_harness.measure.prepare). An image size the model
cannot take is refused in one line (a forward on the meta device, at load).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from training_harness.core.config import did_you_mean
from training_harness.core.errors import HarnessError
from training_harness.workloads import optional
from training_harness.workloads.vision import LibraryClassifier, whole_numbers


class TorchvisionWorkload(LibraryClassifier):
    def create(self) -> nn.Module:
        tv = optional.torchvision()
        return tv.models.get_model(self.model, weights=None, num_classes=self.num_classes,
                                   **self.kwargs)


def build_torchvision(name: str, args: dict[str, Any]) -> TorchvisionWorkload:
    """`torchvision:<name>` with num_classes, image_size and the builder's own keywords."""
    tv = optional.torchvision()
    where = f"workload 'torchvision:{name}'"
    known = tv.models.list_models(module=tv.models)  # classification models only
    if name not in known:
        raise HarnessError(f"{where}: torchvision {tv.__version__} has no classification model "
                           f"'{name}'{did_you_mean(name, known)}; e.g. resnet50, vit_b_16, "
                           "convnext_tiny, efficientnet_b0")
    kwargs = dict(args)
    num_classes = kwargs.pop("num_classes", 1000)
    image_size = kwargs.pop("image_size", 224)
    whole_numbers(where, num_classes=num_classes, image_size=image_size)
    if name.startswith("vit_"):
        kwargs["image_size"] = image_size  # its position embeddings follow it
    if name.startswith("maxvit_"):
        kwargs["input_size"] = (image_size, image_size)  # its window partitions follow it
    workload = TorchvisionWorkload(f"torchvision:{name}", num_classes, image_size, kwargs)
    workload.build_on_meta(where, (TypeError, ValueError, AssertionError))
    workload.check_forward(where, "set image_size to one it takes, e.g. its default 224")
    return workload
