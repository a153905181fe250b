"""The optional packages behind `hf:`, `torchvision:` and `timm:` workloads, imported on
first use (timm imports torchvision, so it goes through `require` too).

A missing one is a HarnessError naming the extra to install. One known mismatch is
mended: PyPI's torchvision wheel is built against the CUDA build of torch, so beside
the CPU build its compiled ops (nms, roi_align ...) do not load, and `import
torchvision` fails while registering `torchvision::nms`'s fake kernel (transformers
imports torchvision when it is installed, so it fails too). Declaring the two op
schemas that registration needs lets both import; the models never call those ops.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

from harness.core.errors import HarnessError

_stub_ops: torch.library.Library | None = None  # kept alive: the schemas live with it


def _declare_torchvision_ops() -> None:
    global _stub_ops
    if _stub_ops is None:
        _stub_ops = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _stub_ops.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _torchvision_importable() -> None:
    """Import torchvision (when installed) so that importing it later cannot fail."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    try:
        importlib.import_module("torchvision")
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _declare_torchvision_ops()
        importlib.import_module("torchvision")


def require(package: str, extra: str) -> ModuleType:
    """`package` imported, or a HarnessError saying which extra installs it."""
    _torchvision_importable()
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise HarnessError(
            f"this workload needs the '{package}' package ({e}); install it with "
            f"pip install -e \".[{extra}]\""
        ) from None


def transformers() -> ModuleType:
    return require("transformers", "hf")


def torchvision() -> ModuleType:
    return require("torchvision", "vision")
