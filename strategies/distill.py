"""Knowledge distillation (Hinton et al., 2015): the student's loss mixes the hard-label
loss with a KL to a teacher's softened outputs,

    loss = (1 - weight) x CE(student, labels) + weight x T^2 x KL(p_teacher,T || p_student,T)

with p_T = softmax(logits / T), the KL taken over the positions that have a label and
averaged over them (the T^2 keeps its gradient's scale as T changes).

The teacher is a workload with trained weights: a folder written by
`harness bench ... --save FOLDER` (a larger gpt, or any workload below), or an
`hf:/folder` with weights. It must share the student's vocabulary. Its forward runs
under no_grad in eval mode, inside the step (so under the step's autocast: the same
precision) and so inside the measured step time; the model FLOPs, and so MFU, count
the student's only, and the record's notes say so. Students: gpt and hf: language
models (causal or masked). Not with tensor parallel or the pipeline (the teacher runs
whole beside the student, and the loss needs the student's whole logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.registry import register
from training_harness.workloads.tokens import IGNORE


@dataclass
class DistillSettings:
    teacher: str = ""  # a folder made by `harness bench --save`, or "hf:/folder" (weights)
    temperature: float = bounded(2.0, 0.01, 1000.0)
    weight: float = bounded(0.5, 0.0, 1.0)  # of the KL term; 1 - weight of the hard labels


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                 temperature: float, weight: float) -> torch.Tensor:
    """(1 - weight) x cross-entropy + weight x T^2 x KL(teacher_T || student_T), the KL
    averaged over the labelled positions (labels != IGNORE)."""
    vocab = student.size(-1)
    s = student.reshape(-1, vocab).float()
    y = labels.reshape(-1)
    hard = F.cross_entropy(s, y, ignore_index=IGNORE)
    keep = y != IGNORE
    t = teacher.reshape(-1, vocab).float()[keep] / temperature
    soft = F.kl_div(F.log_softmax(s[keep] / temperature, dim=-1), F.log_softmax(t, dim=-1),
                    log_target=True, reduction="batchmean") * temperature**2
    return (1 - weight) * hard + weight * soft


def logits(model: nn.Module, ids: torch.Tensor, kind: str) -> torch.Tensor:
    """A language model's logits for `ids`: the gpt's forward without targets, or a
    transformers model's output's `.logits`."""
    return model(ids) if kind == "gpt" else model(input_ids=ids).logits


def kind_of(workload: Any) -> str | None:
    from training_harness.workloads.gpt import GPTWorkload
    from training_harness.workloads.hf import HFWorkload

    if isinstance(workload, GPTWorkload):
        return "gpt"
    return "hf" if isinstance(workload, HFWorkload) else None


def vocab_of(workload: Any) -> int:
    return workload.cfg.vocab if kind_of(workload) == "gpt" else workload.vocab


def longest_of(workload: Any) -> int | None:
    """The longest sequence the model takes (its positions), None where unbounded."""
    if kind_of(workload) == "gpt":
        return workload.cfg.seq_len
    return getattr(workload.config, "max_position_embeddings", None)


def teacher_workload(spec: str, seq_len: int) -> tuple[str, dict[str, Any]]:
    """The teacher's workload name and arguments from the setting (an hf: folder's at the
    student's sequence length, which its positions must cover)."""
    from training_harness.workloads.trained import saved_workload

    if spec.startswith("hf:"):
        return spec, {"seq_len": seq_len}
    return saved_workload(spec)


def load_teacher(spec: str, seq_len: int) -> tuple[Any, nn.Module]:
    from training_harness.workloads import load_workload
    from training_harness.workloads.trained import load_trained

    if spec.startswith("hf:"):
        workload = load_workload(spec, {"seq_len": seq_len})
        with torch.device("cpu"):
            return workload, workload.build_model()
    return load_trained(spec)


class Distill(Strategy):
    name = "distill"
    summary = ("knowledge distillation: hard-label loss mixed with a KL to a trained "
               "teacher's softened outputs (temperature, weight); the teacher's forward in "
               "the step time, the student's FLOPs only in MFU")
    phases = (Phase.STEP,)
    Settings = DistillSettings
    requires = ("a gpt or hf: language-model student, and a teacher with trained weights of "
                "the same vocabulary (harness bench --save FOLDER, or hf:/folder)")

    def space(self):
        return {"temperature": Choice((1.0, 2.0, 4.0)), "weight": Choice((0.25, 0.5, 0.9))}

    def check(self, settings, plan, env):
        from training_harness.workloads import load_workload

        if not settings.teacher:
            return ["distill: name the teacher: teacher = 'FOLDER' (made by `harness bench "
                    "... --save FOLDER`) or 'hf:/folder' with weights"]
        reasons = []
        if plan.layout.tensor > 1 or plan.layout.pipeline > 1 or \
                {"tensor", "pipeline"} & plan.strategies.keys():
            reasons.append("distill: not with tensor parallel or the pipeline (the teacher "
                           "runs whole beside the student, and the loss needs the student's "
                           "whole logits); use data parallel or ZeRO")
        try:
            student = load_workload(plan.workload, plan.workload_args)
        except HarnessError:
            return reasons  # the workload's own check says what is wrong with it
        if kind_of(student) is None:
            return reasons + [f"distill: the student '{plan.workload}' is not a language "
                              "model (gpt or hf:); distillation here mixes token losses"]
        try:
            name, args = teacher_workload(settings.teacher, student.tokens_per_sample)
            teacher = load_workload(name, args)
        except HarnessError as e:
            return reasons + [f"distill: teacher '{settings.teacher}': {e}"]
        if kind_of(teacher) is None:
            return reasons + [f"distill: the teacher '{name}' is not a gpt or hf: language model"]
        if kind_of(teacher) == "hf" and not teacher.source.weights:
            reasons.append(f"distill: the teacher {settings.teacher} has no weights (a teacher "
                           "of random weights teaches nothing); save a trained one there")
        if vocab_of(teacher) != vocab_of(student):
            reasons.append(f"distill: the teacher's vocabulary ({vocab_of(teacher)}) is not "
                           f"the student's ({vocab_of(student)}); they must match token for "
                           "token")
        longest = longest_of(teacher)
        if longest is not None and longest < student.tokens_per_sample:
            reasons.append(f"distill: the teacher takes sequences of {longest} tokens at most, "
                           f"the student's are {student.tokens_per_sample}")
        return reasons

    def apply(self, phase, setup, settings):
        from training_harness.core.plan import Plan
        from training_harness.workloads import load_workload

        plan = setup.plan or Plan()
        student = load_workload(plan.workload, plan.workload_args)
        student_kind = kind_of(student)
        teacher_wl, teacher = load_teacher(settings.teacher, student.tokens_per_sample)
        teacher_kind = kind_of(teacher_wl)
        teacher.to(setup.device).eval().requires_grad_(False)
        if student_kind is None or teacher_kind is None:
            raise HarnessError("distill: the student and the teacher must be gpt or hf: "
                               "language models")
        t, w = settings.temperature, settings.weight

        def loss(model: nn.Module, batch: Any) -> torch.Tensor:
            ids, labels = batch
            with torch.no_grad():  # under the step's autocast: the student's precision
                taught = logits(teacher, ids, teacher_kind)
            return distill_loss(logits(model, ids, student_kind), taught, labels, t, w)

        setup.loss_override = lambda loss_fn: loss
        n = sum(p.numel() for p in teacher.parameters())
        setup.notes.append(
            f"distill: teacher {teacher_wl.name} ({n / 1e6:.3g} M parameters, its forward "
            f"about {2 * n / 1e9:.3g} GFLOP per token) runs in no_grad inside each step, so "
            f"in the step time; model FLOPs and MFU count the student only (T = {t:g}, "
            f"KL weight {w:g})")


register(Distill())
