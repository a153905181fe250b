"""Benchmarking and auto-tuning harness for deep-learning training acceleration."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("training-harness")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

from harness.core import torchvision_ops
from harness.core.errors import HarnessError

torchvision_ops.install()  # in every process, DataLoader workers included

__all__ = ["HarnessError", "__version__"]
