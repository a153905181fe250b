"""Configurations of a search space found without listing it: a seeded sample, the
neighbours of one configuration, and the same configuration one step smaller in memory.

Each goes through the space's one walk (SearchSpace.walk), so whatever it gives is a
configuration the search can propose, at any size of space and with ranges too. A
sample draws each branch point's value uniformly (so configurations under a rarely
taken branch are not rarer than others at that branch point).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from training_harness.core.space import Choice, IntRange, Space
from training_harness.study.search_space import NotInSpace, SearchSpace

MICRO = "micro_batch_size"  # the parameter's name, and the prefix of its per-layout names


def key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def sample(space: SearchSpace, rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Up to `n` distinct configurations' parameters, drawn at random (fewer when the
    space has fewer: the draws stop after 20 n tries)."""
    found: dict[str, dict[str, Any]] = {}
    for _ in range(20 * n):
        if len(found) >= n:
            break
        params: dict[str, Any] = {}

        def ask(name: str, dist: Space, params: dict[str, Any] = params) -> Any:
            params[name] = _draw(dist, rng)
            return params[name]
        space.walk(ask)
        found.setdefault(key(params), params)
    return list(found.values())


def complete(space: SearchSpace, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The parameters the walk reaches from `wanted`: its values where they apply, and
    for a parameter it lacks (or whose value is not offered there) the nearest value
    (a micro-batch size) or the first. None when no configuration results."""
    params: dict[str, Any] = {}

    def ask(name: str, dist: Space) -> Any:
        value = wanted.get(name, wanted.get(_base(name)))
        params[name] = _closest(dist, value)
        return params[name]
    try:
        space.walk(ask)
    except NotInSpace:
        return None
    return params


def neighbours(space: SearchSpace, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The configurations that differ from `params` in one choice (the parameters that
    choice brings in or takes away follow), in a fixed order."""
    base = complete(space, params)
    if base is None:
        return []
    choices: dict[str, Space] = {}

    def record(name: str, dist: Space) -> Any:
        choices[name] = dist
        return base[name]
    space.walk(record)
    found: dict[str, dict[str, Any]] = {}
    for name, dist in choices.items():
        if not isinstance(dist, Choice):
            continue
        for value in dist.values:
            if value != base[name]:
                other = complete(space, {**base, name: value})
                if other is not None and other != base:
                    found.setdefault(key(other), other)
    return list(found.values())


def smaller(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any] | None:
    """The same configuration needing less memory: the next smaller micro-batch size,
    else activation checkpointing turned on (every block); None when neither is offered."""
    base = complete(space, params)
    if base is None:
        return None
    micro = next((n for n in base if _base(n) == MICRO), None)
    if micro is not None:
        below = [m for m in _choices(space, base, micro) if m < base[micro]]
        if below:
            return complete(space, {**base, micro: max(below)})
    if "checkpoint" in space.optional and base.get("checkpoint") is False:
        on = complete(space, {**base, "checkpoint": True, "checkpoint.every": 1})
        if on is not None and on.get("checkpoint"):
            return on
    return None


def _choices(space: SearchSpace, params: dict[str, Any], name: str) -> tuple[Any, ...]:
    found: tuple[Any, ...] = ()

    def ask(n: str, dist: Space) -> Any:
        nonlocal found
        if n == name and isinstance(dist, Choice):
            found = dist.values
        return params[n]
    space.walk(ask)
    return found


def _base(name: str) -> str:
    """micro_batch_size@data2 -> micro_batch_size; zero.stage@d2p1t2 -> zero.stage."""
    return name.partition("@")[0]


def _closest(dist: Space, value: Any) -> Any:
    if isinstance(dist, Choice):
        if value in dist.values:
            return value
        numbers = [v for v in dist.values if isinstance(v, int | float)
                   and not isinstance(v, bool)]
        if isinstance(value, int | float) and not isinstance(value, bool) and numbers:
            return min(numbers, key=lambda v: (abs(math.log(v / value)) if v > 0 < value
                                               else abs(v - value), v))
        return dist.values[0]
    if value is not None and dist.low <= value <= dist.high:
        return value
    return dist.low


def _draw(dist: Space, rng: random.Random) -> Any:
    if isinstance(dist, Choice):
        return rng.choice(list(dist.values))
    low, high = dist.low, dist.high
    x = (math.exp(rng.uniform(math.log(low), math.log(high))) if dist.log
         else rng.uniform(low, high))
    if isinstance(dist, IntRange):
        return min(high, max(low, round(x)))
    return x
