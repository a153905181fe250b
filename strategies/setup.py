"""Setup: the model, optimizer and step that composition builds, and the step itself.

Strategies fill in the fields at their phases; `Setup.step` reads them. The step
is the one place that knows the order inside a training step: autocast around
forward, loss scaling, gradient accumulation without gradient sync on all but
the last micro-step, the optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from training_harness.core.plan import OptimizerSettings, Plan

LossFn = Callable[[nn.Module, Any], torch.Tensor]
# (params, hyper-parameters, implementation) -> optimizer. `impl` is "default",
# "foreach", "fused" or "triton": how the update runs, never what it computes.
OptimizerFactory = Callable[[Iterable[Any], OptimizerSettings, str], torch.optim.Optimizer]
# (params, the factory with hyper-parameters bound) -> a wrapping optimizer (ZeRO-1).
OptimizerWrapper = Callable[
    [Iterable[Any], Callable[..., torch.optim.Optimizer]], torch.optim.Optimizer
]


def adamw(
    params: Iterable[Any], hp: OptimizerSettings, impl: str = "default"
) -> torch.optim.Optimizer:
    """The default optimizer, in torch's default, foreach or fused implementation,
    or our Triton multi-tensor one (kernels.multi_tensor: one launch per group)."""
    if impl == "triton":
        from training_harness.kernels.multi_tensor import MultiTensorAdamW

        return MultiTensorAdamW(
            params, lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay,
            impl="triton",
        )
    flags = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    return torch.optim.AdamW(
        params, lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay, **flags
    )


@dataclass
class Setup:
    model: nn.Module
    device: torch.device
    hyper: OptimizerSettings = field(default_factory=OptimizerSettings)
    accumulation_steps: int = 1
    # Strategies replace these.
    optimizer_factory: OptimizerFactory = adamw
    optimizer_impl: str = "default"
    optimizer_wrapper: OptimizerWrapper | None = None
    optimizer: torch.optim.Optimizer | None = None
    autocast_dtype: torch.dtype | None = None
    grad_scaler: Any = None  # torch.amp.GradScaler (or a sharded one) for fp16
    sync_last_micro_step_only: bool = True
    no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # Filled by workloads or strategies that need a different step (the pipeline:
    # it returns the loss on the last stage and None on the ranks that have none).
    step_override: Callable[[Setup, Sequence[Any], LossFn], torch.Tensor | None] | None = None
    notes: list[str] = field(default_factory=list)
    # The (pipeline, data, tensor) DeviceMesh when the plan runs on several ranks
    # (strategies.mesh), and the plan itself, for strategies that depend on a
    # neighbour's settings (zero reads amp's dtype for FSDP's mixed precision).
    mesh: Any = None
    plan: Plan | None = None
    # Process-wide settings a strategy needs during each step (tf32's matmul
    # precision), entered around the step and restored after it.
    step_contexts: list[Callable[[], contextlib.AbstractContextManager]] = field(
        default_factory=list)
    # Entered around a validation loss: the weights it is taken with (weight
    # averaging swaps its averages in and back out); by default the model's own.
    evaluation: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # Strategies that change what a step computes, by the step's index (its count of
    # `step` calls, the trial loop's step number): a change to each micro-batch (the
    # curriculum's shorter sequences), then a loss in place of the given one
    # (distillation's mix with a teacher's outputs, given the workload's loss).
    batch_transform: Callable[[int, Any], Any] | None = None
    loss_override: Callable[[LossFn], LossFn] | None = None
    # (model FLOPs, tokens) of one sample at step i where a strategy changes them step
    # by step (the curriculum's lengths); None: the workload's fixed figures.
    work_at: Callable[[int], tuple[float, float | None]] | None = None
    # The curriculum's length schedule (strategies.curriculum.Schedule): a target trial
    # times its steps at several lengths (training_harness.measure.length_times).
    length_schedule: Any = None
    steps_done: int = 0

    def build_optimizer(self) -> torch.optim.Optimizer:
        params: list[Any] = [p for p in self.model.parameters() if p.requires_grad]
        dtensors = [p for p in params if isinstance(p, DTensor)]
        if dtensors and len(dtensors) < len(params):
            # Tensor parallel leaves norms and embeddings plain: foreach and fused
            # kernels take DTensors or plain tensors, not both, so one group each.
            plain = [p for p in params if not isinstance(p, DTensor)]
            params = [{"params": dtensors}, {"params": plain}]

        def make(p: Iterable[Any], **_: Any) -> torch.optim.Optimizer:
            return self.optimizer_factory(p, self.hyper, self.optimizer_impl)

        if self.optimizer_wrapper is not None:
            return self.optimizer_wrapper(params, make)
        return make(params)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def step(self, micro_batches: Sequence[Any], loss_fn: LossFn) -> torch.Tensor | None:
        """One optimizer step over `micro_batches`; returns the mean loss (a tensor).

        The loss stays on the device: reading it would synchronise, and the caller
        decides when that happens.
        """
        index, self.steps_done = self.steps_done, self.steps_done + 1
        if self.batch_transform is not None:
            micro_batches = [self.batch_transform(index, b) for b in micro_batches]
        if self.loss_override is not None:
            loss_fn = self.loss_override(loss_fn)
        if not self.step_contexts:  # the timed step: no ExitStack where nothing is entered
            return self._step(micro_batches, loss_fn)
        with contextlib.ExitStack() as stack:
            for context in self.step_contexts:
                stack.enter_context(context())
            return self._step(micro_batches, loss_fn)

    def _step(self, micro_batches: Sequence[Any], loss_fn: LossFn) -> torch.Tensor | None:
        if self.step_override is not None:
            return self.step_override(self, micro_batches, loss_fn)
        assert self.optimizer is not None, "compose() builds the optimizer"
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            last = i == n - 1
            skip_sync = not last and self.sync_last_micro_step_only
            sync = self.no_sync() if skip_sync else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    loss = loss_fn(self.model, batch) / n
                if self.grad_scaler is not None:
                    self.grad_scaler.scale(loss).backward()
                else:
                    loss.backward()
            total += loss.detach().float()
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total
