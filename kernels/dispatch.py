"""Fused Triton kernels, each with a plain-PyTorch reference and an autograd Function.

    kernels.layernorm      LayerNorm forward and backward (FusedLayerNorm)
    kernels.bias_gelu      gelu(x + b), tanh or erf (LinearBiasGELU)
    kernels.cross_entropy  softmax cross-entropy chunked over the vocabulary (ChunkedCrossEntropy)
    kernels.linear_cross_entropy  the LM head and the loss over chunks of tokens
                                  (LinearCrossEntropy; plain PyTorch, no Triton)
    kernels.multi_tensor   AdamW / LAMB steps over many tensors in a fixed number of launches

Dispatch (`use_triton`): a CUDA tensor takes the Triton kernel when triton imports; a
CPU tensor takes the plain-PyTorch reference, or Triton's interpreter when
TRITON_INTERPRET=1. Triton reads that variable when it is first imported (its
own library, `tl.sum` and the like, is decorated then), so it must be set before
anything imports triton (tests/kernels/conftest.py does so).

Importing this package or a kernel module never imports triton (and works
without it): the kernels are `LazyKernel`s, decorated with triton.jit at their
first launch, in the mode TRITON_INTERPRET says then; triton is imported by the
first dispatch that could use it (on CUDA, or with TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch

KERNELS = ("layernorm", "bias_gelu", "cross_entropy", "multi_tensor")
IMPLS = ("auto", "triton", "reference")


@functools.cache
def triton_import_error() -> str | None:
    """None when triton imports, else the error (imported once, then remembered)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_interpreted() -> bool:
    """Whether triton was imported in interpreter mode (its own library decorated so)."""
    import triton.language.standard as standard

    return type(standard.sum).__name__ == "InterpretedFunction"


def why_not_triton(x: torch.Tensor | None = None) -> str | None:
    """Why the Triton path cannot run for tensors like `x` (CUDA ones if x is None
    and a GPU is present); None when it can. Imports triton only when it may run."""
    on_cuda = x.is_cuda if x is not None else torch.cuda.is_available()
    if not on_cuda and not interpreter_requested():
        if importlib.util.find_spec("triton") is None:
            return "no CUDA device, and triton is not installed"
        return "no CUDA device (TRITON_INTERPRET=1 runs the kernels in Triton's interpreter)"
    if err := triton_import_error():
        return f"triton does not import ({err})"
    if on_cuda and interpreter_requested():
        return "TRITON_INTERPRET=1 is set, and the interpreter runs CPU tensors only"
    if not on_cuda and not _triton_interpreted():
        return "TRITON_INTERPRET=1 was set after triton was imported; set it before"
    return None


def use_triton(x: torch.Tensor) -> bool:
    """True where the Triton kernel runs for `x`: on CUDA, or on the CPU via the interpreter."""
    return why_not_triton(x) is None


def resolve(impl: str, x: torch.Tensor, supported: bool = True) -> bool:
    """Whether a call with `impl` ("auto" | "triton" | "reference") takes the Triton path.

    `supported` is the kernel's own check of the inputs (dtype, shape); "auto" falls
    back to the reference when it is False, "triton" refuses.
    """
    if impl == "reference":
        return False
    if impl == "auto":
        return supported and use_triton(x)
    if impl == "triton":
        reason = why_not_triton(x) or (None if supported else "inputs the kernel does not handle")
        if reason:
            raise RuntimeError(f"impl='triton' cannot run here: {reason}")
        return True
    raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")


def available() -> dict[str, str]:
    """Per kernel: where its Triton path runs here, or why only the reference does."""
    if interpreter_requested():
        x = torch.empty(0)  # the interpreter runs CPU tensors
        label = "triton interpreter (TRITON_INTERPRET=1)"
    else:
        x, label = None, "triton (cuda)"
    reason = why_not_triton(x)
    return dict.fromkeys(KERNELS, label if reason is None else f"reference only: {reason}")


class LazyKernel:
    """A Triton kernel decorated with triton.jit at its first launch, once per mode.

    triton.jit makes an interpreted kernel if TRITON_INTERPRET=1 when it runs, a
    compiled one otherwise; deferring it to the launch lets the variable decide
    per call instead of at import. (Triton's own library, tl.sum and the like, is
    still decorated when triton is first imported: `why_not_triton` checks that.)
    The kernels do not call each other, so no jit'd helper has to match the mode.

    The kernel modules do not import triton: their `tl` global is None until the
    first launch binds it to triton.language (the kernels' `tl.constexpr`
    annotations are strings, never evaluated, under `from __future__ import
    annotations`). So importing them neither needs triton nor fixes the mode.
    """

    def __init__(self, fn):
        self.fn = fn
        self._jitted: dict[bool, Any] = {}
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        mode = interpreter_requested()
        if mode not in self._jitted:
            import triton
            import triton.language

            self.fn.__globals__["tl"] = triton.language  # the kernel modules leave it unset
            self._jitted[mode] = triton.jit(self.fn)
        return self._jitted[mode][grid]


jit = LazyKernel  # the kernels' decorator


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
