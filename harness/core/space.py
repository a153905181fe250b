"""The values a setting may take in a search, as plain data (no torch).

A strategy declares its searchable settings with these (strategies.base
re-exports them); a study narrows them (training_harness.study.checks); the search space
turns them into Optuna distributions. They cross a process boundary as JSON
(`space_to_json`, `space_from_json`): the tuner gets them from its torch-side
helper (training_harness.launch.torch_helper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """A categorical setting: one of `values`."""

    values: tuple[Any, ...]

    def describe(self) -> str:
        return " | ".join(repr(v) for v in self.values)


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    log: bool = False

    def describe(self) -> str:
        return f"int [{self.low}, {self.high}]" + (" log" if self.log else "")


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    log: bool = False

    def describe(self) -> str:
        return f"float [{self.low:g}, {self.high:g}]" + (" log" if self.log else "")


Space = Choice | IntRange | FloatRange


@dataclass
class SettingsSpace:
    """One strategy's settings in a study: searched, fixed, and its defaults."""

    searched: dict[str, Space] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # values this device cannot run
    # A parallel strategy's layouts ("d1p1t2") refused for the study's workload, and why
    # (training_harness.study.refusals): the search space leaves them out.
    refused: dict[str, str] = field(default_factory=dict)
    # Per layout key, the searched values that run there where they are fewer.
    layout_values: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"searched": {k: space_to_json(v) for k, v in self.searched.items()},
                "fixed": self.fixed, "defaults": self.defaults, "left_out": self.left_out,
                "refused": self.refused, "layout_values": self.layout_values}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SettingsSpace:
        return cls({k: space_from_json(v) for k, v in data["searched"].items()},
                   dict(data["fixed"]), dict(data["defaults"]), list(data["left_out"]),
                   dict(data.get("refused", {})),
                   {k: {s: [_frozen(v) for v in vs] for s, vs in per.items()}
                    for k, per in data.get("layout_values", {}).items()})


def space_to_json(space: Space) -> dict[str, Any]:
    if isinstance(space, Choice):
        return {"choice": list(space.values)}
    kind = "int" if isinstance(space, IntRange) else "float"
    return {kind: [space.low, space.high], "log": space.log}


def space_from_json(data: dict[str, Any]) -> Space:
    if "choice" in data:
        return Choice(tuple(_frozen(v) for v in data["choice"]))
    if "int" in data:
        return IntRange(*data["int"], log=data["log"])
    return FloatRange(*data["float"], log=data["log"])


def _frozen(value: Any) -> Any:
    """A JSON list back as the tuple a setting's value was (Choice values are hashable)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
