"""The registry: every strategy by name. A duplicate name is refused.

The built-in strategies register when their modules are imported; `get` and
`all_strategies` import them first (`load_builtins`), so no caller has to.
"""

from __future__ import annotations

import importlib

from training_harness.core.config import did_you_mean
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Strategy

_REGISTRY: dict[str, Strategy] = {}

BUILTINS = ("accumulation", "amp", "averaging", "channels_last", "checkpoint", "curriculum",
            "ddp", "distill", "float8", "fused", "lamb", "lars", "liger", "lora", "muon",
            "pipeline", "sparse_attention", "tensor", "tf32", "zero")


_loaded = False  # every built-in imported: `get` is called per plan (harness plan: thousands)


def load_builtins() -> None:
    """Import (and so register) every built-in strategy, once."""
    global _loaded
    if _loaded:
        return
    for name in BUILTINS:
        importlib.import_module(f"training_harness.strategies.{name}")
    _loaded = True


def register(strategy: Strategy) -> Strategy:
    if strategy.name in _REGISTRY:
        raise ValueError(f"a strategy named '{strategy.name}' is already registered")
    _REGISTRY[strategy.name] = strategy
    return strategy


def get(name: str) -> Strategy:
    load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise HarnessError(
            f"unknown strategy '{name}'{did_you_mean(name, _REGISTRY)}; "
            f"known: {', '.join(sorted(_REGISTRY))} (see `harness strategies`)"
        ) from None


def all_strategies() -> list[Strategy]:
    """Every registered strategy, in composition order (then by name)."""
    load_builtins()
    return sorted(_REGISTRY.values(), key=lambda s: (min(s.phases), s.name))
