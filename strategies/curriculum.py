"""Curriculum learning by sequence length (as DeepSpeed's `seqlen` curriculum): short
sequences first, growing to the full length over a number of samples.

Step i has seen i x global batch samples; its length follows the schedule:

- `linear`: start + (full - start) x seen / samples (DeepSpeed's `fixed_linear`);
- `stepped`: the samples split into `stages` equal parts, part k at
  start + (full - start) x k / stages (DeepSpeed's `fixed_discrete`, evenly spaced);

rounded down to a multiple of `multiple` (fewer shapes for torch.compile, as
DeepSpeed's `difficulty_step`), never below `start`, and the full length once `samples`
are seen. Each micro-batch is cut to that length (inputs and labels alike: DeepSpeed's
`seqlen_truncate`); validation losses are taken at the full length. The step's model
FLOPs and tokens are those of the length it ran (`Setup.work_at`), so throughput and
MFU count the shorter sequences honestly.

For language models whose inputs may be shorter: `gpt` and `hf:` causal LMs. Models
with fixed-size inputs (images, an MLP), masked LMs and the pipeline (its schedule
fixes the micro-batch's shape) are refused with the reason.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register


@dataclass
class CurriculumSettings:
    start: int = bounded(16, 1, 2**24)  # the sequence length of the first steps
    samples: int = bounded(4096, 1, 2**40)  # samples over which it grows to the full length
    schedule: Literal["linear", "stepped"] = "linear"
    stages: int = bounded(4, 1, 4096)  # stepped: equal parts of `samples`, one length each
    multiple: int = bounded(8, 1, 2**20)  # lengths are rounded down to a multiple of this


@dataclass(frozen=True)
class Schedule:
    settings: CurriculumSettings
    full: int  # the workload's sequence length
    batch: int  # the global batch: samples per step

    def length(self, step: int) -> int:
        """The sequence length of step `step` (0-based)."""
        s = self.settings
        seen = step * self.batch
        if seen >= s.samples or s.start >= self.full:
            return self.full
        if s.schedule == "linear":
            grown = s.start + (self.full - s.start) * seen // s.samples
        else:
            stage = seen * s.stages // s.samples
            grown = s.start + (self.full - s.start) * stage // s.stages
        return min(self.full, max(s.start, grown // s.multiple * s.multiple))


def truncate(batch: Any, length: int) -> Any:
    """A language model's (inputs, labels) cut to their first `length` positions."""
    return tuple(t[:, :length] for t in batch)


def language_model(name: str, args: dict[str, Any]) -> tuple[Any, str | None]:
    """(the workload, None) when `name` may train on shorter sequences; else
    (None or the workload, the reason in words)."""
    from training_harness.workloads import load_workload
    from training_harness.workloads.gpt import GPTWorkload
    from training_harness.workloads.hf import HFWorkload

    if name != "gpt" and not name.startswith("hf:"):
        return None, (f"workload '{name}' takes inputs of a fixed size; the sequence-length "
                      "curriculum is for language models: gpt or an hf: causal LM")
    try:
        w = load_workload(name, args)
    except HarnessError:
        return None, None  # the workload's own check says what is wrong with it
    if isinstance(w, HFWorkload) and not w.causal:
        return w, (f"{w.name} is a masked LM (a fixed count of masked positions per "
                   "sequence); the sequence-length curriculum is for causal LMs")
    if not isinstance(w, GPTWorkload | HFWorkload):
        return w, f"workload '{name}' is not a gpt or hf: language model"
    return w, None


def flops_at(workload: Any, length: int) -> float:
    """Forward + backward model FLOPs of one sample of `length` tokens: the workload's
    own count (6N + 12·L·H·Q·T per token) with its sequence length set to `length`."""
    from training_harness.workloads.gpt import GPTWorkload

    if length == workload.tokens_per_sample:
        return workload.flops_per_sample()
    if isinstance(workload, GPTWorkload):
        cfg = dataclasses.replace(workload.cfg, seq_len=length, data="synthetic")
        return GPTWorkload(cfg).flops_per_sample()
    shorter = copy.copy(workload)  # hf: the count reads seq_len
    shorter.seq_len = shorter.tokens_per_sample = length
    return shorter.flops_per_sample()


class Curriculum(Strategy):
    name = "curriculum"
    summary = ("sequence-length curriculum: short sequences first, growing to the full "
               "length over a number of samples (linear or stepped); FLOPs counted per length")
    phases = (Phase.STEP,)
    Settings = CurriculumSettings
    requires = "a gpt or hf: causal LM workload; not with the pipeline"

    def space(self):
        return {"start": Choice((8, 16, 32, 64)), "samples": Choice((1024, 4096, 16384)),
                "schedule": Choice(("linear", "stepped"))}

    def check(self, settings, plan, env):
        reasons = []
        workload, why = language_model(plan.workload, plan.workload_args)
        if why:
            reasons.append(f"curriculum: {why}")
        elif workload is not None and settings.start > workload.tokens_per_sample:
            reasons.append(f"curriculum: start {settings.start} is longer than the workload's "
                           f"seq_len {workload.tokens_per_sample}; lower start")
        if "pipeline" in plan.strategies or plan.layout.pipeline > 1:
            reasons.append("curriculum: the pipeline's schedule fixes each micro-batch's "
                           "shape, so the sequence length cannot change; drop one of them")
        return reasons

    def apply(self, phase, setup, settings):
        from training_harness.core.plan import Plan

        plan = setup.plan or Plan()
        workload, why = language_model(plan.workload, plan.workload_args)
        if workload is None or why:
            raise HarnessError(f"curriculum: {why or 'the workload could not be loaded'}")
        schedule = Schedule(settings, workload.tokens_per_sample, plan.batch_size)
        flops: dict[int, float] = {}

        def work_at(step: int) -> tuple[float, float]:
            n = schedule.length(step)
            if n not in flops:
                flops[n] = flops_at(workload, n)
            return flops[n], float(n)

        setup.batch_transform = lambda step, batch: truncate(batch, schedule.length(step))
        setup.work_at = work_at
        setup.length_schedule = schedule
        steps = -(-settings.samples // plan.batch_size)
        setup.notes.append(
            f"curriculum ({settings.schedule}): sequence length {schedule.length(0)} at step 0, "
            f"{schedule.full} from step {steps} ({settings.samples} samples); FLOPs and "
            "tokens per step counted at each step's length")


register(Curriculum())
