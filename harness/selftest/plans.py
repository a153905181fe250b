"""Which plans fit the devices here: a plan needs, on each node, the product of its
[layout] data, pipeline and tensor sizes divided by its node count, one device a rank."""

from __future__ import annotations

import glob
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlanFit:
    path: Path
    name: str
    ranks_per_node: int
    fits: bool
    reason: str  # why it does not fit; "" when it does


def _size(table: dict, key: str) -> int:
    value = table.get(key, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def ranks_per_node(data: dict) -> int:
    """data x pipeline x tensor / nnodes (nnodes from [layout] or the top level, default 1)."""
    layout = data.get("layout") if isinstance(data.get("layout"), dict) else {}
    world = _size(layout, "data") * _size(layout, "pipeline") * _size(layout, "tensor")
    nnodes = _size(layout, "nnodes") if "nnodes" in layout else _size(data, "nnodes")
    return math.ceil(world / nnodes)


def plan_fit(path: str | Path, gpus: int) -> PlanFit:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        return PlanFit(path, path.stem, 0, False, f"cannot read the plan: {e}")
    name = data.get("name") if isinstance(data.get("name"), str) else path.stem
    ranks = ranks_per_node(data)
    if ranks <= gpus:
        return PlanFit(path, name, ranks, True, "")
    return PlanFit(path, name, ranks, False,
                   f"needs {ranks} GPUs per node ({_layout_text(data)}); {gpus} visible here")


def _layout_text(data: dict) -> str:
    layout = data.get("layout") if isinstance(data.get("layout"), dict) else {}
    parts = [f"{k} = {layout[k]}" for k in ("data", "pipeline", "tensor", "nnodes")
             if k in layout]
    return "[layout] " + ", ".join(parts) if parts else "one rank"


def find_plans(pattern: str) -> list[Path]:
    """The plan files the glob names, sorted; a plain file name is its own match."""
    return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if p.endswith(".toml"))
