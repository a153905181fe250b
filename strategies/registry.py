"""The registry: every strategy by name. A duplicate name is refused."""

from __future__ import annotations

from harness.core.config import did_you_mean
from harness.core.errors import HarnessError
from strategies.base import Strategy

_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in _REGISTRY:
        raise ValueError(f"a strategy named '{strategy.name}' is already registered")
    _REGISTRY[strategy.name] = strategy
    return strategy


def get(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise HarnessError(
            f"unknown strategy '{name}'{did_you_mean(name, _REGISTRY)}; "
            f"known: {', '.join(sorted(_REGISTRY))} (see `harness strategies`)"
        ) from None


def all_strategies() -> list[Strategy]:
    """Every registered strategy, in composition order (then by name)."""
    return sorted(_REGISTRY.values(), key=lambda s: (min(s.phases), s.name))
