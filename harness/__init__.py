"""Benchmarking and auto-tuning harness for deep-learning training acceleration.

The distribution owns one import name, `training_harness`, and this folder is its root.
The repository keeps `strategies/`, `kernels/` and `reports/` beside this folder, where
the wheel puts them inside it; in a checkout, the package's path takes in the
repository, so `training_harness.strategies` is found there (docs/architecture.md#one-import-name).
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

if __name__ != "training_harness":  # a checkout on sys.path: harness/ imported by its folder's name
    raise ImportError(
        f"this package is training_harness, imported here as {__name__!r}: "
        "import training_harness (or run `harness` / `python -m training_harness`)"
    )

_here = Path(__file__).resolve().parent
if not (_here / "strategies").is_dir() and (_here.parent / "strategies").is_dir():
    __path__.append(str(_here.parent))  # a checkout: the sibling folders are subpackages

try:
    __version__ = version("training-harness")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

from training_harness.core import torchvision_ops  # noqa: E402
from training_harness.core.errors import HarnessError  # noqa: E402

torchvision_ops.install()  # in every process, DataLoader workers included

__all__ = ["HarnessError", "__version__"]
