"""Distillation's teacher in the estimate (strategies.distill): the memory it holds beside
the student and the forward it adds to each step.

The teacher sits on the device whole, in fp32 as it was saved (no gradients, no
optimizer state), on every rank. Its logits, and the log-softmax of its and the
student's logits at the temperature, are kept from the forward to the backward of the
KL: three fp32 tensors of micro-batch x sequence x vocabulary (an upper bound: the
teacher's raw logits may be freed once their log-softmax exists). Its forward is about
2 x its parameters FLOPs per token: in the step time, never in the model FLOPs (MFU
counts the student only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan

FP32 = 4
KEPT_LOGITS = 3  # the teacher's logits and both log-softmaxes at the temperature


@dataclass(frozen=True)
class TeacherCost:
    weights_bytes: int
    logits_bytes: int
    forward_flops_per_sample: float
    parameters: int

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.logits_bytes

    def assumption(self) -> str:
        from training_harness.core.units import format_bytes

        return (f"distill: the teacher's {self.parameters / 1e6:.3g} M parameters in fp32 "
                f"({format_bytes(self.weights_bytes)}) and {KEPT_LOGITS} fp32 tensors of "
                f"micro-batch x sequence x vocabulary kept for the KL "
                f"({format_bytes(self.logits_bytes)}); its forward (2 FLOPs per parameter "
                "and token) is in the step time, not in MFU")


def teacher_cost(plan: Plan, workload: Any, micro_batch: int) -> TeacherCost | None:
    """The teacher's terms, or None without [strategies.distill] (or where its teacher
    cannot be read: the strategy's check says why)."""
    table = plan.strategies.get("distill")
    if table is None or not table.get("teacher"):
        return None
    import torch

    from training_harness.strategies.distill import teacher_workload, vocab_of
    from training_harness.workloads import load_workload

    try:
        name, args = teacher_workload(str(table["teacher"]), workload.tokens_per_sample)
        teacher = load_workload(name, args)
        with torch.device("meta"):
            model = teacher.build_model()
    except (HarnessError, OSError):
        return None
    n = sum(p.numel() for p in model.parameters())
    weights = sum(t.numel() * FP32 for t in [*model.parameters(), *model.buffers()])
    tokens = workload.tokens_per_sample
    logits = KEPT_LOGITS * micro_batch * tokens * int(vocab_of(workload)) * FP32
    return TeacherCost(int(weights), int(logits), 2.0 * n * tokens, n)
