"""The one function that owns the order in which techniques are applied."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training_harness.core.device import RuntimeEnv, resolve_device
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.strategies.base import Phase, Strategy
from training_harness.strategies.mesh import build_mesh, layout_reasons
from training_harness.strategies.registry import get
from training_harness.strategies.setup import Setup


def active(plan: Plan) -> list[tuple[Strategy, Any]]:
    """The plan's strategies with parsed settings (unknown names and keys refused)."""
    return [
        (get(name), get(name).parse(table, f"[strategies.{name}]"))
        for name, table in plan.strategies.items()
    ]


def reasons_against(plan: Plan, env: RuntimeEnv) -> list[str]:
    """Everything that stops `plan` from running here, in words; empty when it can run."""
    chosen = active(plan)
    reasons: list[str] = []
    try:
        steps = plan.accumulation_steps
    except HarnessError as e:
        return [str(e)]
    # The pipeline feeds the micro-batches through its schedule itself.
    if steps > 1 and not {"accumulation", "pipeline"} & plan.strategies.keys():
        reasons.append(
            f"global_batch_size {plan.batch_size} needs {steps} micro-steps of "
            f"{plan.micro_batch_size}: add [strategies.accumulation], or set "
            f"global_batch_size = micro_batch_size x data-parallel"
        )
    reasons += layout_reasons(plan)
    for strategy, settings in chosen:
        reasons += strategy.check(settings, plan, env)
    return reasons


def validate(plan: Plan, env: RuntimeEnv) -> None:
    """Raise a HarnessError naming what to change when `plan` cannot run here."""
    reasons = reasons_against(plan, env)
    if reasons:
        raise HarnessError("; ".join(reasons))


def resolved(plan: Plan) -> Plan:
    """`plan` with every strategy's settings written out in full (defaults filled)."""
    from training_harness.core.config import to_table

    return plan.replace(
        strategies={s.name: to_table(settings) for s, settings in active(plan)}
    )


def compose(
    model: nn.Module,
    plan: Plan | Mapping[str, Mapping[str, Any]],
    device: torch.device | str | None = None,
    env: RuntimeEnv | None = None,
) -> Setup:
    """Apply the plan's strategies to `model` in their fixed order (docs/architecture.md);
    return the Setup.

    `plan` may be a whole Plan or just its strategies, e.g.
    ``compose(model, {"amp": {"dtype": "bf16"}, "checkpoint": {}})``.
    Call ``setup.step(micro_batches, loss_fn)`` once per optimizer step.
    """
    if not isinstance(plan, Plan):
        plan = Plan(strategies={k: dict(v) for k, v in plan.items()})
    device = torch.device(device) if device is not None else resolve_device(plan.device)
    env = env or RuntimeEnv.detect(device.type)
    validate(plan, env)
    chosen = active(plan)

    setup = Setup(
        model=_on(model, device),
        device=device,
        hyper=plan.optimizer,
        accumulation_steps=plan.accumulation_steps,
        plan=plan,
    )
    if plan.world_size > 1 and dist.is_available() and dist.is_initialized():
        setup.mesh = build_mesh(plan.layout, device.type)
    for phase in Phase:
        for strategy, settings in chosen:
            if phase in strategy.phases:
                strategy.apply(phase, setup, settings)
        if phase is Phase.OPTIMIZER:
            # Every optimizer-phase choice is made (which optimizer, its kernels,
            # a sharding wrapper); now build it over the final parameters.
            setup.optimizer = setup.build_optimizer()
    return setup


def _on(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` on `device`, moved only where a tensor is elsewhere: the estimator composes
    on fake tensors (training_harness.estimator.op_trace), which `.to` cannot swap."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    return model if all(t.device == device for t in tensors) else model.to(device)
