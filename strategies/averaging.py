"""Weight averaging (EMA or SWA), evaluated with the averaged weights, as a strategy.

After each optimizer step (a step post-hook on the optimizer, so its cost is inside
the timed step) the averages are updated with torch.optim.swa_utils' own update
functions: `get_ema_multi_avg_fn(decay)` (a <- decay a + (1 - decay) w) or
`get_swa_multi_avg_fn()` (the running mean of the weights averaged so far). The
first average is the weights after step `start` + 1. A validation loss is taken
with the averages swapped into the model and the model's own weights put back
after (`Setup.evaluation`), so training itself goes on from its own weights.

It keeps its averages beside the model rather than in an
`torch.optim.swa_utils.AveragedModel`: that deep-copies the module, which a DDP,
checkpoint or compile wrapper around it does not survive, and swapping tensors in
evaluates through whatever wraps the model. Floating-point buffers (BatchNorm's
running statistics) are averaged too, as AveragedModel does with use_buffers=True.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.optim.swa_utils import get_ema_multi_avg_fn, get_swa_multi_avg_fn

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Space, Strategy
from training_harness.strategies.registry import get, register
from training_harness.strategies.setup import Setup


class Averager:
    """The running average of `tensors` (the model's trainable parameters and float
    buffers), updated by `update()` after each optimizer step."""

    def __init__(self, tensors: list[torch.Tensor], method: str, decay: float,
                 start: int = 0, every: int = 1) -> None:
        self.tensors = tensors
        self.method, self.start, self.every = method, start, every
        self.fn = get_ema_multi_avg_fn(decay) if method == "ema" else get_swa_multi_avg_fn()
        self.averages: list[torch.Tensor] | None = None
        self.averaged = 0  # weights averaged so far
        self.steps = 0  # optimizer steps seen

    @torch.no_grad()
    def update(self) -> None:
        self.steps += 1
        after = self.steps - self.start
        if after < 1 or (after - 1) % self.every:
            return
        current = [t.detach() for t in self.tensors]
        if self.averages is None:
            self.averages = [t.clone() for t in current]
        elif current:
            self.fn(self.averages, current, self.averaged)
        self.averaged += 1

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averages in the model's tensors inside, its own weights back after (the
        model's own before any average exists)."""
        if self.averages is None:
            yield
            return
        with torch.no_grad():
            own = [t.detach().clone() for t in self.tensors]
            for t, a in zip(self.tensors, self.averages, strict=True):
                t.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for t, o in zip(self.tensors, own, strict=True):
                    t.copy_(o)


@dataclass
class AveragingSettings:
    method: Literal["ema", "swa"] = "ema"
    decay: float = 0.999  # EMA's; SWA weighs every averaged step alike
    start: int = bounded(0, 0, 10**9)  # optimizer steps before the first average
    every: int = bounded(1, 1, 10**6)  # steps between updates of the average

    def validate(self, where: str) -> None:
        if not 0 < self.decay < 1:
            raise HarnessError(f"{where}.decay: must be above 0 and below 1 (EMA's weight "
                               "on the average so far)")


class AveragingStrategy(Strategy):
    name = "averaging"
    summary = "EMA or SWA of the weights; validation losses taken with the averages"
    phases = (Phase.STEP,)
    Settings = AveragingSettings
    requires = "nothing"

    def space(self) -> dict[str, Space]:
        return {"method": Choice(("ema", "swa")), "decay": Choice((0.99, 0.999))}

    def check(self, settings: AveragingSettings, plan: Any, env: Any) -> list[str]:
        reasons = []
        zero = plan.strategies.get("zero")
        stage = get("zero").parse(zero).stage if zero is not None else 0
        if stage >= 2:
            reasons.append(f"averaging: keeps a whole copy of each parameter and swaps it in "
                           f"to evaluate; zero stage {stage} (FSDP2) shards the "
                           "parameters (DTensor), which it does not average: use zero stage 1 "
                           "or ddp")
        if "tensor" in plan.strategies and plan.layout.tensor > 1:
            reasons.append("averaging: keeps a whole copy of each parameter and swaps it in "
                           "to evaluate; tensor parallel shards them (DTensor), which it does "
                           "not average: use data or pipeline parallelism")
        return reasons

    def apply(self, phase: Phase, setup: Setup, settings: AveragingSettings) -> None:
        assert setup.optimizer is not None, "compose builds the optimizer before the step phase"
        model = setup.model
        tensors = [p for p in model.parameters() if p.requires_grad]
        tensors += [b for b in model.buffers() if torch.is_floating_point(b)]
        averager = Averager(tensors, settings.method, settings.decay, settings.start,
                            settings.every)
        setup.optimizer.register_step_post_hook(lambda *_: averager.update())
        setup.evaluation = averager.swapped_in
        what = (f"EMA, decay {settings.decay:g}" if settings.method == "ema" else "SWA")
        setup.notes.append(f"averaging: {what} of {len(tensors)} tensors, from step "
                           f"{settings.start + 1}, every {settings.every}; evaluated with "
                           "the averages")


register(AveragingStrategy())
