"""A configuration in one line, as every table and live line shows it.

`d2p1t1 mb 8 | fused(attention=sdpa, optimizer=fused) amp(dtype=bf16)`: each strategy
with its main settings (SHOWN) and those the caller names, the ones that differ from
their defaults (`differing`) or between the rows of a table (`varying`), so that two
configurations the search tells apart never read the same.
"""

from __future__ import annotations

from typing import Any


def describe_plan(plan: dict[str, Any], also: dict[str, set[str]] | None = None) -> str:
    """The plan in one line (the module's doc); the global batch too (`mb 16 gb 512`)
    where accumulation makes it more than mb x data. `also`: the settings shown per
    strategy beyond SHOWN."""
    lay = plan.get("layout") or {}
    parts = []
    for name, settings in (plan.get("strategies") or {}).items():
        if name == "accumulation":
            continue
        keys = set(SHOWN.get(name, ())) | (also or {}).get(name, set())
        shown = ", ".join(f"{k}={v}" for k, v in (settings or {}).items() if k in keys)
        parts.append(f"{name}({shown})" if shown else name)
    layout = f"d{lay.get('data', 1)}p{lay.get('pipeline', 1)}t{lay.get('tensor', 1)}"
    mb, gb = plan.get("micro_batch_size"), plan.get("global_batch_size")
    batch = f"mb {mb}" + (f" gb {gb}" if gb and mb and gb != mb * lay.get("data", 1) else "")
    # no strategy: plain fp32 (the baseline's configuration, or the search's at its batch)
    return f"{layout} {batch} | {' '.join(parts) or 'plain fp32'}"


def differing(plan: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    """Per strategy of `plan`, the settings whose values are not their defaults."""
    return {name: {k for k, v in (settings or {}).items()
                   if k in defaults.get(name, {}) and defaults[name][k] != v}
            for name, settings in (plan.get("strategies") or {}).items()}


def varying(plans: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per strategy, the settings that take more than one value among `plans` (those
    that have the strategy)."""
    seen: dict[str, dict[str, set[str]]] = {}
    for plan in plans:
        for name, settings in (plan.get("strategies") or {}).items():
            for k, v in (settings or {}).items():
                seen.setdefault(name, {}).setdefault(k, set()).add(repr(v))
    return {name: {k for k, values in keys.items() if len(values) > 1}
            for name, keys in seen.items()}


# the settings worth a glance in one line (the record has them all)
SHOWN = {"fused": ("attention", "optimizer", "compile"), "amp": ("dtype",),
          "checkpoint": ("every",), "zero": ("stage", "offload"), "pipeline": ("schedule",),
          "ddp": ("compression",), "lamb": ()}
