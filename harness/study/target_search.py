"""A study's [target] table: how each configuration is trained to `target_loss`, and
which of the settings that change the maths are searched (docs/tuning.md, "Time to a
target loss"). A list of one value holds it; every plan gets a
training_harness.core.target.TargetSpec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.core.space import Choice, FloatRange, Space
from training_harness.core.target import TargetSpec

OPTIMIZERS = ("adamw", "lamb", "lars", "muon")


@dataclass
class LrSpan:
    """Learning rates drawn log-uniformly from min to max."""

    min: float
    max: float

    def validate(self, where: str) -> None:
        if not (0 < self.min <= self.max < math.inf):
            raise HarnessError(f"{where}: need 0 < min <= max")


@dataclass
class StudyTarget:
    """Training to target_loss (objective time_to_loss): each list is searched."""

    optimizer: list[Literal["adamw", "lamb", "lars", "muon"]] = field(
        default_factory=lambda: ["adamw"])
    """The optimizers searched (their settings: docs/strategies.md)."""
    lr: list[float] | LrSpan | dict[str, list[float]] | None = None
    """Learning rates: a list, { min, max } (log-uniform), or a list per optimizer
    { adamw = [1e-3], lamb = [1e-2] } (unset: the [optimizer] table's lr)."""
    lr_scaling: list[Literal["none", "linear", "sqrt"]] = field(default_factory=lambda: ["none"])
    """How the lr scales from base_batch to each global batch."""
    base_batch: int = bounded(0, 0, 2**30)
    """The global batch the lr was set for; needed by a scaling other than none."""
    warmup_samples: list[int] = field(default_factory=lambda: [0])
    """Samples of linear lr warm-up."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """One run to the target per seed (initial weights and data order): median and spread."""
    max_samples: int = bounded(1 << 20, 1, 2**40)
    """A run that has not reached the target after these samples is a miss."""
    max_steps: int = bounded(0, 0, 10**9)
    """A cap on a run's optimizer steps as well (0: only max_samples caps it)."""
    eval_every: int = bounded(4096, 1, 2**40)
    """Samples between validation losses, measured off the clock."""
    eval_samples: int = bounded(512, 1, 2**30)
    """Held-out samples each validation loss is over."""

    def validate(self, where: str) -> None:
        for key in ("optimizer", "lr_scaling", "warmup_samples", "seeds"):
            values = getattr(self, key)
            if not values or len(set(values)) != len(values):
                raise HarnessError(f"{where}.{key}: give one or more different values")
        lists = self.lr.values() if isinstance(self.lr, dict) else [self.lr]
        for lrs in lists:
            if isinstance(lrs, list) and (not lrs or any(not 0 < v < math.inf for v in lrs)):
                raise HarnessError(f"{where}.lr: give learning rates above 0")
        if isinstance(self.lr, dict) and set(self.lr) != set(self.optimizer):
            raise HarnessError(f"{where}.lr: give a list for each optimizer of "
                               f"{self.optimizer}, e.g. {{ adamw = [1e-3], lamb = [1e-2] }}")
        if any(v < 0 for v in self.warmup_samples):
            raise HarnessError(f"{where}.warmup_samples: each must be 0 or more")
        if set(self.lr_scaling) != {"none"} and not self.base_batch:
            raise HarnessError(f"{where}.base_batch: lr_scaling scales the lr from the batch "
                               "it was set for; give that batch as base_batch")

    def lr_space(self, optimizer: str, default_lr: float) -> tuple[str, Space]:
        """The lr's parameter name and space (lr@<optimizer> when each has its own)."""
        if isinstance(self.lr, LrSpan):
            return "lr", FloatRange(self.lr.min, self.lr.max, log=True)
        if isinstance(self.lr, dict):
            return f"lr@{optimizer}", Choice(tuple(self.lr[optimizer]))
        return "lr", Choice(tuple(self.lr or [default_lr]))

    def rest(self) -> dict[str, Space]:
        return {"lr_scaling": Choice(tuple(self.lr_scaling)),
                "warmup_samples": Choice(tuple(self.warmup_samples))}

    def spec(self, loss: float, values: dict[str, Any]) -> TargetSpec:
        """The plan's [target] for the values a trial drew."""
        return TargetSpec(loss=loss, seeds=list(self.seeds), max_samples=self.max_samples,
                          max_steps=self.max_steps, eval_every=self.eval_every,
                          eval_samples=self.eval_samples, lr_scaling=values["lr_scaling"],
                          base_batch=self.base_batch,
                          warmup_samples=values["warmup_samples"])


def check_target(study: Any, where: str) -> None:
    """objective time_to_loss needs target_loss, and the other way round; LAMB, LARS and
    Muon are the [target] table's optimizer choice, not strategies to search on and off."""
    wants = "time_to_loss" in study.objectives
    if wants and study.target_loss is None:
        raise HarnessError(f"{where}.target_loss: objective 'time_to_loss' needs the validation "
                           "loss to reach; add target_loss = ...")
    if study.target_loss is not None and not math.isfinite(study.target_loss):
        raise HarnessError(f"{where}.target_loss: give a finite validation loss")
    named = [name for name in OPTIMIZERS if name in study.strategies]
    if study.target_loss is not None and named:
        raise HarnessError(f"{where}.strategies.{named[0]}: with target_loss the optimizer is "
                           f"chosen by [target].optimizer = ['adamw', '{named[0]}']; remove "
                           f"[strategies.{named[0]}]")
    if len(study.global_batches) > 1 and study.target_loss is None:
        raise HarnessError(f"{where}.global_batch_size: searching the global batch needs "
                           "objective 'time_to_loss' and target_loss (a larger batch always "
                           "has the higher throughput); give one global_batch_size")
