"""One seed's run to the target: fresh weights, trained until the validation loss
reaches `target.loss`, or the cap.

It trains the plan's maths and nothing else (`maths_plan`): one process, no
parallel layout, and of the strategies only those that change the numbers (amp's
precision, LAMB, LARS, Muon, weight averaging; DDP's PowerSGD compression, in a
process group of this process alone: strategies.ddp.alone says why that is the data
ranks' maths) or keep memory in bounds without changing them (accumulation,
checkpointing). The seed sets the initial weights and
the data order (as MLPerf's seeds do): seed k's step s trains on the workload's batch
s + k x DATA_STRIDE, so seed 0's is batch s, as in every trial, and a fine-tuning
from saved weights still differs from seed to seed. The lr is the plan's, scaled with
the global batch and warmed up as [target] says.

The validation loss is taken every `eval_every` samples, between steps and off the
training clock; the first at 0 samples, from the fresh weights. It is measured honestly:
always over the same held-out samples (the workload's `eval_batch` 0, 1, ... of a fixed
size), in eval mode, without gradients, in the step's precision (the autocast the
strategies set: the precision is part of the model being judged). The steps to target
are those after which it was first at or below the target: a resolution of eval_every
samples. A run that stops short (cap, or a loss that is not finite) records the best
loss it reached and is a miss, never a hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any

import torch
from torch import nn

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import MATHS_STRATEGIES, OPTIMIZERS
from training_harness.measure.batches import split_batch
from training_harness.strategies.compose import compose
from training_harness.strategies.ddp import alone, powersgd_of, wrap_ddp
from training_harness.workloads import Workload

MAX_EVAL_BATCH = 64


def eval_batch_size(samples: int) -> int:
    """The largest size up to MAX_EVAL_BATCH that divides `samples`: every batch full."""
    return max(b for b in range(1, min(MAX_EVAL_BATCH, samples) + 1) if samples % b == 0)


@torch.no_grad()
def validation_loss(model: nn.Module, workload: Workload, samples: int,
                    device: torch.device | str,
                    autocast: contextlib.AbstractContextManager | None = None) -> float:
    """The mean loss over the first `samples` held-out samples (training mode restored)."""
    was_training = model.training
    model.eval()
    size = eval_batch_size(samples)
    total = 0.0
    try:
        for i in range(samples // size):
            batch = workload.eval_batch(size, i, device)
            with autocast or contextlib.nullcontext():
                loss = workload.loss(model, batch)
            total += float(loss.float())
    finally:
        model.train(was_training)
    value = total / (samples // size)
    return value if math.isfinite(value) else math.inf


# What a convergence run keeps of the plan's strategies (everything else leaves the
# maths unchanged and is there for speed or for several ranks).
KEPT = ("amp", "checkpoint", *OPTIMIZERS, *MATHS_STRATEGIES)


def maths_plan(plan: Plan) -> Plan:
    """The plan in one process: micro-batches of (at most) micro x data samples,
    accumulated to the global batch, with the scaled lr."""
    assert plan.target is not None
    batch = plan.batch_size
    want = min(batch, plan.micro_batch_size * plan.layout.data)
    micro = max(m for m in range(1, want + 1) if batch % m == 0)
    strategies = {k: dict(v) for k, v in plan.strategies.items() if k in KEPT}
    if batch // micro > 1:
        strategies["accumulation"] = {}
    lr = plan.target.lr(plan.optimizer.lr, batch)
    return plan.replace(layout=Layout(), micro_batch_size=micro, global_batch_size=batch,
                        strategies=strategies,
                        optimizer=dataclasses.replace(plan.optimizer, lr=lr))


# Seed k's batches start this far into the workload's stream: more steps than any run
# takes, and a small enough index for a user's batch() that seeds numpy with it.
DATA_STRIDE = 1_000_000


def data_index(step: int, seed: int) -> int:
    """The workload's batch index of seed `seed`'s step `step`."""
    return step + seed * DATA_STRIDE


def train_to_target(plan: Plan, workload: Workload, device: torch.device,
                    runtime: RuntimeEnv | None, seed: int) -> dict[str, Any]:
    powersgd = powersgd_of(plan)
    if powersgd is None:
        return _train_to_target(plan, workload, device, runtime, seed)
    # DDP's PowerSGD compresses the gradients: its hook, in a group of this process alone
    with alone(device) as pg:
        return _train_to_target(plan, workload, device, runtime, seed, (powersgd, pg))


def _train_to_target(plan: Plan, workload: Workload, device: torch.device,
                     runtime: RuntimeEnv | None, seed: int, powersgd=None) -> dict[str, Any]:
    spec = plan.target
    assert spec is not None
    run_plan = maths_plan(plan)
    batch, micro_steps = run_plan.batch_size, run_plan.accumulation_steps
    torch.manual_seed(seed)
    with torch.device(device):
        model = workload.build_model()
    setup = compose(model, run_plan, device, runtime)
    if powersgd is not None:
        settings, pg = powersgd
        wrap_ddp(setup, "ddp", settings.bucket_cap_mb, "powersgd",
                 settings.gradient_as_bucket_view, settings, pg=pg)
    warm = spec.warmup_steps(batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        setup.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    max_steps = spec.max_steps or math.inf

    def evaluate(step: int, samples: int, train_s: float, train_loss: float | None) -> float:
        with setup.evaluation():  # weight averaging: its averaged weights
            value = validation_loss(setup.model, workload, spec.eval_samples, device,
                                    setup.autocast())
        curve.append({"step": step, "samples": samples, "train_s": train_s,
                      "val_loss": value, "train_loss": train_loss})
        return value

    curve: list[dict[str, Any]] = []
    t_eval = time.perf_counter()
    reached_at = 0 if evaluate(0, 0, 0.0, None) <= spec.loss else None
    eval_s = time.perf_counter() - t_eval
    step, samples, train_s, stopped = 0, 0, 0.0, "reached" if reached_at == 0 else ""
    next_eval = spec.eval_every
    while not stopped:
        t0 = time.perf_counter()
        micro = split_batch(workload.batch(batch, data_index(step, seed), device), micro_steps)
        loss = setup.step(micro, workload.loss)
        schedule.step()
        value = float(loss) if loss is not None else math.nan  # reading it synchronises
        train_s += time.perf_counter() - t0
        step, samples = step + 1, samples + batch
        capped = samples >= spec.max_samples or step >= max_steps
        if not math.isfinite(value):
            stopped = "diverged"
        elif samples >= next_eval or capped:
            t_eval = time.perf_counter()
            val = evaluate(step, samples, train_s, value)
            eval_s += time.perf_counter() - t_eval
            while next_eval <= samples:
                next_eval += spec.eval_every
            if val <= spec.loss:
                reached_at, stopped = step, "reached"
        if not stopped and capped:
            stopped = "max_samples" if samples >= spec.max_samples else "max_steps"
    losses = [p["val_loss"] for p in curve]
    return {
        "seed": seed, "reached": reached_at is not None, "stopped": stopped,
        "steps_to_target": reached_at,
        "samples_to_target": None if reached_at is None else reached_at * batch,
        "best_val_loss": min(losses), "final_val_loss": losses[-1],
        "steps": step, "samples": samples, "train_s": train_s, "eval_s": eval_s,
        "micro_batch_size": run_plan.micro_batch_size, "lr": run_plan.optimizer.lr,
        "warmup_steps": warm, "curve": curve,
    }
