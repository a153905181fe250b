"""The study's [storage] table: how workers sharing an RDB storage watch each other.

Read with the study file (training_harness.study.study_file); used by the tuner's storage
(training_harness.tune.storage), which applies it to the database it opens.
"""

from __future__ import annotations

from dataclasses import dataclass

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.core.units import parse_duration


@dataclass
class StorageSpec:
    """How workers sharing one storage watch each other (docs/storage.md)."""

    heartbeat: str | float = "60s"
    """A running trial's worker says it is alive this often."""
    grace: str | float = "3m"
    """Silence after which another worker fails the trial (and runs it again)."""
    retries: int = bounded(1, 0, 100)
    """Runs again of a trial whose worker died."""
    patience: str | float = "10m"
    """How long a worker waits for an unreachable storage before it stops (exit 3)."""

    def validate(self, where: str) -> None:
        beat = parse_duration(self.heartbeat, f"{where}.heartbeat")
        grace = parse_duration(self.grace, f"{where}.grace")
        parse_duration(self.patience, f"{where}.patience")
        if beat < 1:
            raise HarnessError(f"{where}.heartbeat: at least 1s (Optuna counts whole seconds)")
        if grace <= beat:
            raise HarnessError(f"{where}.grace: must be longer than heartbeat ({self.heartbeat}), "
                               "or live trials would be failed")

    def seconds(self, key: str) -> int:
        return max(1, round(parse_duration(getattr(self, key), f"storage.{key}")))
