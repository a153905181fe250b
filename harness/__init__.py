"""Benchmarking and auto-tuning harness for deep-learning training acceleration."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("training-harness")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

from harness.core.errors import HarnessError

__all__ = ["HarnessError", "__version__"]
