"""The optional packages behind `hf:`, `torchvision:` and `timm:` workloads, imported on
first use (timm imports torchvision, so it goes through `require` too).

A missing one is a HarnessError naming the extra to install. One known mismatch is
mended: PyPI's torchvision wheel is built against the CUDA build of torch, so beside
the CPU build `import torchvision` (and transformers, which imports it) fails while
registering `torchvision::nms`'s fake kernel. training_harness.core.torchvision_ops mends that
before torchvision's first import in every process (`import training_harness` installs it, so
DataLoader workers get it too); `require` keeps a second line for a process where
torchvision's import failed all the same.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from training_harness.core import torchvision_ops, versions
from training_harness.core.errors import HarnessError


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
        torchvision_ops.declare()
        importlib.import_module("torchvision")


def require(package: str, extra: str) -> ModuleType:
    """`package` imported, or a HarnessError saying which extra installs it, or that the
    version installed is outside the range the harness is tested with."""
    versions.check(package)
    _torchvision_importable()
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise HarnessError(
            f"this workload needs the '{package}' package ({e}); install it with "
            f"pip install 'training-harness[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        ) from None


def transformers() -> ModuleType:
    return require("transformers", "hf")


def torchvision() -> ModuleType:
    return require("torchvision", "vision")
