"""Gradient accumulation: several micro-batches per optimizer step.

The number of micro-steps follows from the plan: global batch / (micro-batch x
data-parallel size). With a data-parallel wrapper, gradients are synchronised on
the last micro-step only (the wrapper's no_sync on the others).
"""

from __future__ import annotations

from dataclasses import dataclass

from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class AccumulationSettings:
    sync_last_only: bool = True  # skip the gradient all-reduce on all but the last micro-step


class Accumulation(Strategy):
    name = "accumulation"
    summary = "gradient accumulation: global batch / (micro-batch x data-parallel) micro-steps"
    phases = (Phase.STEP,)
    Settings = AccumulationSettings
    requires = "global_batch_size a multiple of micro_batch_size x data-parallel size"

    def check(self, settings, plan, env):
        try:
            _ = plan.accumulation_steps  # raises when the batch does not divide
        except HarnessError as e:
            return [str(e)]
        return []

    def apply(self, phase, setup, settings):
        setup.sync_last_micro_step_only = settings.sync_last_only
        setup.notes.append(f"accumulation: {setup.accumulation_steps} micro-steps")


register(Accumulation())
