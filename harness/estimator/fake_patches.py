"""Library code that picks a kernel fake tensors cannot run, steered while tracing.

transformers' mixture-of-experts layers (Mixtral, Qwen-MoE, OLMoE ...) run their experts
with `torch.nn.functional.grouped_mm` where the device allows; its meta kernel checks
CUDA's rules (bf16 only), so a CPU fake-tensor trace of an fp32 model fails there.
transformers' own fallback, `torch.ops.transformers.grouped_mm_fallback`, has a fake
kernel and saves the same tensors for backward (the tokens' inputs and the weights),
so the trace takes it. Real tensors keep transformers' own choice.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t) or getattr(getattr(t, "device", None), "type", None) == "meta"


@contextlib.contextmanager
def fake_friendly() -> Iterator[None]:
    """Inside: transformers' grouped experts take their fake-able path on fake tensors."""
    moe = sys.modules.get("transformers.integrations.moe")
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:
        yield
        return

    def can_use(input: Any, weight: Any, offs: Any) -> bool:
        if _is_fake(weight) or _is_fake(input):
            return False
        return original(input, weight, offs)

    moe._can_use_grouped_mm = can_use
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


@contextlib.contextmanager
def quiet_fake_errors() -> Iterator[None]:
    """Inside: fake tensors' own log of a failed meta kernel (a traceback at ERROR level)
    is held back; the trace reports the failure itself, in one line."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
