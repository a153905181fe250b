"""What a strategy is: one acceleration technique, its settings, where it acts.

A strategy is small: a settings dataclass, the search space of those settings,
`check` (the reasons it cannot apply to a plan here, in words) and `apply` at
each phase it declares. `strategies.compose` calls the phases in order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

from training_harness.core.config import from_table, to_table
from training_harness.core.space import Choice, FloatRange, IntRange, Space

# The space types live in training_harness.core.space (the tuner reads them without torch).
__all__ = ["Choice", "FloatRange", "IntRange", "Phase", "Space", "Strategy"]

if TYPE_CHECKING:
    from training_harness.core.device import RuntimeEnv
    from training_harness.core.plan import Plan
    from training_harness.strategies.setup import Setup


class Phase(IntEnum):
    """Where in the composition a strategy acts; the numbers are the order that
    docs/architecture.md states (the order strategies compose in).

    Phase 1 (building the model) belongs to the workload. The order follows what
    techniques require of each other: kernels are swapped before anything wraps
    the modules; tensor parallel shards plain modules; float8 swaps the linears
    after tensor parallel and before the data-parallel wrapper (FSDP), as
    torchtitan does; checkpoint wrappers go inside compile; the pipeline splits
    the compiled blocks; the data-parallel wrapper sees each stage; the
    optimizer sees the final (maybe sharded) parameters; the step runs last.
    """

    MODULE_SWAP = 2
    TENSOR_PARALLEL = 3
    LOW_PRECISION = 4  # float8 training's linears (torchao)
    CHECKPOINT = 5
    COMPILE = 6
    PIPELINE = 7
    DATA_PARALLEL = 8
    OPTIMIZER = 9
    STEP = 10


class Strategy(ABC):
    """One technique. Subclasses set the class attributes and implement `apply`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    phases: ClassVar[tuple[Phase, ...]]
    Settings: ClassVar[type]
    requires: ClassVar[str] = "nothing"
    # Issue-level stage of the technique: distributed ones need world_size > 1.
    distributed: ClassVar[bool] = False

    def space(self) -> dict[str, Space]:
        """The searchable settings and their ranges (a subset of Settings' fields)."""
        return {}

    def parse(self, table: dict[str, Any], where: str = "") -> Any:
        """Settings from a TOML table, refusing unknown keys and wrong types."""
        return from_table(self.Settings, table, where or f"[strategies.{self.name}]")

    def defaults(self) -> dict[str, Any]:
        return to_table(self.Settings())

    def check(self, settings: Any, plan: Plan, env: RuntimeEnv) -> list[str]:
        """Reasons this strategy cannot apply to `plan` here; empty when it can."""
        return []

    @abstractmethod
    def apply(self, phase: Phase, setup: Setup, settings: Any) -> None:
        """Change `setup` at `phase` (one of `self.phases`)."""
