"""torchvision importable beside a torch it was not built for, in every process.

PyPI's torchvision wheel is built against the CUDA build of torch, so beside the CPU
build its compiled ops (nms, roi_align ...) do not load, and `import torchvision`
fails while registering `torchvision::nms`'s fake kernel; transformers, peft and timm
import torchvision when it is installed, so they fail too. Declaring the two op schemas
that registration needs lets all of them import; the models never call those ops.

The mend must come before torchvision's first import in each process, and not only in
the one that builds the workload: a DataLoader's workers (spawn or forkserver) unpickle
the workload, and with it transformers' config classes, in a fresh interpreter.
`install()` (run by `import training_harness`, which that unpickling always does first, since
the dataset is a harness class) puts a finder ahead of the import system's: at the first
`import torchvision` it loads torchvision's compiled ops as torchvision itself would,
and declares the schemas only where they fail to load. It imports nothing until then,
so the tuner's process stays free of torch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from typing import Any

_library: Any = None  # torch.library.Library, kept alive: the schemas live with it
_probed = False


def declare() -> None:
    """Declare the op schemas torchvision's fake-kernel registration needs (once)."""
    global _library
    if _library is None:
        import torch

        _library = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            _library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _ops_load(package_dirs: list[str]) -> bool:
    """Whether torchvision's compiled ops (`_C`) load, found and loaded as
    torchvision.extension does."""
    import torch

    loader = (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES)
    for folder in package_dirs:
        spec = importlib.machinery.FileFinder(folder, loader).find_spec("_C")
        if spec is not None and spec.origin:
            try:
                torch.ops.load_library(spec.origin)
            except OSError:
                return False
            return True
    return False


def mend() -> None:
    """Before torchvision's first import in this process: declare the schemas when its
    compiled ops do not load here. Does nothing once torchvision is imported."""
    global _probed
    if _probed or "torchvision" in sys.modules:
        return
    _probed = True  # first: find_spec below comes through the finder again
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    if not _ops_load(list(spec.submodule_search_locations)):
        declare()


class _Finder:
    """Finds nothing itself: mends torchvision's import before the others find it."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision" and not _probed:
            mend()
        return None


def install() -> None:
    """Mend torchvision's first import in this process (and in forks of it)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
