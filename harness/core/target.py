"""Training to a target validation loss: the settings, and what of a plan changes its maths.

A plan with a [target] table is also trained, from fresh weights and in one process,
until its validation loss reaches `loss` (training_harness.measure.convergence); its time to
target is the steps that took times the step time measured for its own layout.

    [target]
    loss = 1.9                  # validation loss to reach (the workload's loss, nats)
    seeds = [0, 1, 2]           # one run per seed: the median and the spread
    max_samples = 262144        # a run that has not reached it by then missed
    eval_every = 4096           # samples between validation losses (fixed counts)
    eval_samples = 512          # held-out samples each validation loss is over
    lr_scaling = "sqrt"         # the plan's lr is for base_batch: none | linear | sqrt
    base_batch = 16
    warmup_samples = 2048       # linear lr warm-up over this many samples

The steps to target depend only on what changes the maths (`maths_key`): the workload
and its data, the global batch, the optimizer (AdamW, LAMB, LARS or Muon) and its settings,
weight averaging, DDP's PowerSGD compression (its rank and warm-up), the lr schedule
above, the precision, the device kind and the seed.
Layout, micro-batch, checkpointing, ZeRO, pipeline, compile and kernels leave them
unchanged, so one run serves them all (training_harness.measure.target_cache).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError

# 2: each seed draws its own batches (training_harness.measure.convergence.data_index)
KEY_VERSION = 2
# Workload arguments that choose a kernel, not a result (gpt's attention: explicit or sdpa;
# an hf: model's attn_implementation: eager or sdpa).
KERNEL_ARGS = frozenset({"attention", "attn_implementation"})
# Strategy settings that choose how an update runs, never what it computes.
IMPLEMENTATION_SETTINGS = frozenset({"foreach", "fused", "impl"})


@dataclass
class TargetSpec:
    loss: float
    seeds: list[int] = field(default_factory=lambda: [0])
    max_samples: int = bounded(1 << 20, 1, 2**40)
    max_steps: int = bounded(0, 0, 10**9)  # 0: only max_samples caps a run
    eval_every: int = bounded(4096, 1, 2**40)
    eval_samples: int = bounded(512, 1, 2**30)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    base_batch: int = bounded(0, 0, 2**30)  # the batch the plan's lr is for (0: any)
    warmup_samples: int = bounded(0, 0, 2**40)

    def validate(self, where: str) -> None:
        if not math.isfinite(self.loss):
            raise HarnessError(f"{where}.loss: give a finite validation loss to reach")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise HarnessError(f"{where}.seeds: give one or more different seeds")
        if any(not 0 <= s < 2**63 for s in self.seeds):
            raise HarnessError(f"{where}.seeds: each must be between 0 and 2^63 - 1")
        if self.lr_scaling != "none" and not self.base_batch:
            raise HarnessError(f"{where}.base_batch: lr_scaling = '{self.lr_scaling}' scales the "
                               "lr from the batch it was set for; give that batch as base_batch")
        if self.eval_every > self.max_samples:
            raise HarnessError(f"{where}.eval_every: {self.eval_every} is above max_samples "
                               f"({self.max_samples}); no validation loss would be measured")

    def lr(self, lr: float, batch: int) -> float:
        """The peak lr at global batch `batch` (scaled from base_batch)."""
        if self.lr_scaling == "none" or not self.base_batch:
            return lr
        ratio = batch / self.base_batch
        return lr * (ratio if self.lr_scaling == "linear" else math.sqrt(ratio))

    def warmup_steps(self, batch: int) -> int:
        return -(-self.warmup_samples // batch)


# Strategies that replace AdamW as the optimizer (strategies.lamb, .lars, .muon).
OPTIMIZERS = ("lamb", "lars", "muon")
# Strategies beside the optimizer that change what is trained or evaluated, so their
# settings are part of the maths key (strategies.averaging: the weights evaluated;
# curriculum, distill, lora, sparse_attention: what each step trains).
MATHS_STRATEGIES = ("averaging", "curriculum", "distill", "lora", "sparse_attention")


def optimizer_name(strategies: dict[str, Any]) -> str:
    """The plan's optimizer: the optimizer strategy it names, else "adamw"."""
    return next((name for name in OPTIMIZERS if name in strategies), "adamw")


def technique_name(strategies: dict[str, Any]) -> str:
    """What the plan trains with, in words: its optimizer and the maths-changing
    strategies beside it, e.g. "adamw + curriculum" (the report's rows and legends)."""
    powersgd = (strategies.get("ddp") or {}).get("compression") == "powersgd"
    return " + ".join([optimizer_name(strategies)]
                      + [name for name in MATHS_STRATEGIES if name in strategies]
                      + ["powersgd"] * powersgd)


def _settings(table: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in sorted((table or {}).items()) if k not in IMPLEMENTATION_SETTINGS}


def _optimizer(strategies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    name = optimizer_name(strategies)
    return {"name": name, "settings": _settings(strategies.get(name))}


def precision(strategies: dict[str, dict[str, Any]]) -> str:
    amp = strategies.get("amp")
    return "fp32" if amp is None else str(amp.get("dtype", "bf16"))


def maths_key(plan: dict[str, Any], seed: int, device_type: str) -> str:
    """What a convergence run's result depends on, as one string (a plan in its TOML
    form, as records keep it). Two plans with the same key train the same model on the
    same data by the same updates, however they are laid out."""
    target = dict(plan.get("target") or {})
    target.pop("seeds", None)
    workload = dict(plan.get("workload") or {})
    strategies = plan.get("strategies") or {}
    batch = plan.get("global_batch_size") or (
        plan["micro_batch_size"] * (plan.get("layout") or {}).get("data", 1))
    table = {
        "version": KEY_VERSION,
        "workload": {k: v for k, v in workload.items() if k not in KERNEL_ARGS},
        "global_batch": batch,
        "optimizer": {**_optimizer(strategies), "hyper": plan.get("optimizer")},
        "precision": precision(strategies),
        "target": target,
        "device": device_type,
        "seed": seed,
    }
    training = {name: _settings(strategies[name]) for name in MATHS_STRATEGIES
                if name in strategies}
    ddp = strategies.get("ddp") or {}
    if ddp.get("compression") == "powersgd":  # compressed gradients (strategies.ddp)
        training["powersgd"] = {k: v for k, v in sorted(ddp.items())
                                if k in ("powersgd_rank", "start_powersgd_iter")}
    if "distill" in training:  # the teacher's weights as saved: retrained, another key
        training["distill"]["teacher_weights"] = folder_weights(
            str(training["distill"].get("teacher", "")))
    if training:  # absent otherwise, so that the keys cached before stay valid
        table["training"] = training
    start = folder_weights(str(workload.get("name", "")))
    if start:  # an hf:/folder's saved weights (a fine-tuning's start): saved again, another key
        table["start_weights"] = start
    return json.dumps(table, sort_keys=True, default=str)


def folder_weights(where: str) -> list[list[Any]]:
    """The files of a folder of weights (`hf:/folder` or a path): name, size and
    modification time each; [] where `where` is not a folder (a hub name, "gpt")."""
    spec = where.removeprefix("hf:")
    folder = Path(spec).expanduser()
    if not spec or not is_folder(spec) or not folder.is_dir():
        return []
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(folder.iterdir())
            if f.suffix in (".safetensors", ".bin", ".pt")]


def is_folder(spec: str) -> bool:
    """`hf:<spec>` names a folder: a path (/, ., ~ first) or a relative one with a "/"
    that exists. A bare name is a model type, even beside a folder of that name (so
    `--save llama` run here does not turn the next `hf:llama` into that folder)."""
    return spec.startswith(("/", ".", "~")) or ("/" in spec and Path(spec).expanduser().is_dir())
