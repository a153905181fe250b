"""Building a model on the meta device for its sizes alone, without its initialisation.

    with on_meta():
        model = workload.build_model()

On the meta device an initialiser (`nn.init.normal_`, a module's reset_parameters)
changes nothing a size is read from, yet costs: meta's random fills are Python
decompositions, and the first imports torch._dynamo (over a CPU-second in the
tuner's torch-side helper, which otherwise never needs it). Here the in-place fills
of a meta tensor return it as it is. A torch function mode, so it holds for this
thread only, like `torch.device("meta")` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# torch.nn.init's initialisers (they hand a tensor with a torch function to the mode
# whole), and the in-place fills they and the modules' reset_parameters end in.
_FILLS: set[Any] = {getattr(torch.nn.init, name) for name in dir(torch.nn.init)
          if name.endswith("_") and not name.startswith("_")} | {
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_,
    torch.Tensor.exponential_, torch.Tensor.bernoulli_, torch.Tensor.random_,
    torch.Tensor.log_normal_, torch.Tensor.cauchy_, torch.Tensor.geometric_,
    torch.Tensor.erfinv_, torch.Tensor.clamp_, torch.Tensor.mul_, torch.Tensor.add_,
}


class _SkipMetaFills(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        # torch.nn.init passes its tensor by name, a Tensor method as its first argument
        tensor = args[0] if args else kwargs.get("tensor")
        if func in _FILLS and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """`torch.device("meta")`, with a meta tensor's in-place fills skipped."""
    with torch.device("meta"), _SkipMetaFills():
        yield
