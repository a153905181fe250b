"""`harness strategies`: the registry as a table for people and as JSON for scripts."""

from __future__ import annotations

from typing import Any

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan


def _here(strategy, env: RuntimeEnv) -> str:
    """Whether the strategy with default settings can run on this machine."""
    if strategy.distributed:
        return "needs several ranks"
    plan = Plan(device=env.device_type, strategies={strategy.name: {}})
    reasons = strategy.check(strategy.parse({}), plan, env)
    return "yes" if not reasons else "no: " + "; ".join(reasons)


def strategies_json() -> list[dict[str, Any]]:
    from training_harness.strategies.registry import all_strategies

    env = RuntimeEnv.detect()
    out = []
    for s in all_strategies():
        space = s.space()
        out.append({
            "name": s.name,
            "summary": s.summary,
            "phases": [p.name.lower() for p in s.phases],
            "settings": {
                k: {"default": v, "space": space[k].describe() if k in space else None}
                for k, v in s.defaults().items()
            },
            "requires": s.requires,
            "available_here": _here(s, env),
            "kernels_here": s.availability() if hasattr(s, "availability") else None,
        })
    return out


def strategies_text() -> str:
    lines = []
    for s in strategies_json():
        lines.append(f"{s['name']}  [{', '.join(s['phases'])}]  {s['summary']}")
        for key, info in s["settings"].items():
            space = f"   search: {info['space']}" if info["space"] else ""
            lines.append(f"    {key} = {info['default']!r}{space}")
        lines.append(f"    requires: {s['requires']}; here: {s['available_here']}")
        for kernel, where in (s["kernels_here"] or {}).items():
            lines.append(f"    kernel {kernel}: {where}")
        lines.append("")
    lines.append("Composition order: module swaps, tensor parallel, checkpointing, compile, "
                 "pipeline, data parallel, optimizer, step.")
    return "\n".join(lines)
