"""Plan: everything needed to run one trial, and nothing else.

A plan is read from TOML (or built in code) and written back whole into every
result, so `harness bench` on a stored plan re-runs it exactly. In TOML the
workload's arguments sit beside its name:

    [workload]
    name = "gpt"
    layers = 4

and each strategy is a table under [strategies] holding its settings.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from training_harness.core.cluster import ClusterSpec
from training_harness.core.config import (
    TomlFile,
    bounded,
    did_you_mean,
    from_table,
    split_workload,
    to_table,
)
from training_harness.core.errors import HarnessError
from training_harness.core.target import TargetSpec


@dataclass
class Layout:
    """How the world is split: data x pipeline x tensor parallel ranks."""

    data: int = bounded(1, 1, 2**20)
    pipeline: int = bounded(1, 1, 4096)
    tensor: int = bounded(1, 1, 4096)

    @property
    def world_size(self) -> int:
        return self.data * self.pipeline * self.tensor

    @property
    def key(self) -> str:  # the search space's name of it, "d2p1t2"
        return f"d{self.data}p{self.pipeline}t{self.tensor}"

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pipeline, data, tensor) index of global `rank`: tensor varies fastest, so
        tensor-parallel peers sit on one node. This is the row-major order of a
        DeviceMesh of shape (pipeline, data, tensor)."""
        return (
            rank // (self.tensor * self.data),
            (rank // self.tensor) % self.data,
            rank % self.tensor,
        )


@dataclass
class OptimizerSettings:
    """Hyper-parameters of the optimizer (AdamW unless a strategy replaces it)."""

    lr: float = 1e-3
    """The learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW's)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """The moving averages' coefficients [beta1, beta2]."""
    eps: float = 1e-8
    """Added to the denominator for numerical stability."""

    def validate(self, where: str) -> None:
        if not self.lr > 0:
            raise HarnessError(f"{where}.lr: must be above 0")
        if self.weight_decay < 0:
            raise HarnessError(f"{where}.weight_decay: must be 0 or more")
        if not all(0 <= b < 1 for b in self.betas):
            raise HarnessError(f"{where}.betas: each must be in [0, 1)")
        if not self.eps > 0:
            raise HarnessError(f"{where}.eps: must be above 0")


@dataclass
class Plan(TomlFile):
    name: str = "plan"
    workload: str = "gpt"
    workload_args: dict[str, Any] = field(default_factory=dict)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    layout: Layout = field(default_factory=Layout)
    micro_batch_size: int = bounded(8, 1, 2**24)
    global_batch_size: int | None = None  # default: micro_batch_size x data
    strategies: dict[str, dict[str, Any]] = field(default_factory=dict)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    warmup_steps: int = bounded(3, 0, 10**6)
    steps: int = bounded(10, 1, 10**6)
    seed: int = bounded(0, 0, 2**63 - 1)
    timeout_s: float = bounded(900.0, 1e-3, 30 * 86400)
    cluster: ClusterSpec | None = None  # where it runs: this machine unless [cluster] says
    # also train to a validation loss (training_harness.core.target)
    target: TargetSpec | None = None
    # Each rank's caching allocator is capped at this many bytes per device (less the
    # context; training_harness.measure.memory.apply_memory_cap): a study's memory budget. None: no
    # cap
    memory_budget_bytes: int | None = None
    # Warm-up runs `warmup_steps`, then on until the step times settle (the last 3 within
    # 5%), `warmup_max_steps` at most (default: 50 on CUDA, `warmup_steps` elsewhere);
    # the measured window then lasts `steps` or `min_window_s` (default: 2 s on CUDA, 0
    # elsewhere), whichever is longer (training_harness.core.window.window_rule)
    warmup_max_steps: int | None = None
    min_window_s: float | None = None
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the trial's environment
    # (training_harness.launch.local.allocator_env); a study's budget.expandable_segments
    expandable_segments: bool = True
    # Write the trained weights here after the measured steps (`harness bench --save`,
    # training_harness.workloads.trained): a distillation teacher, or fine-tuning's start
    save: str | None = None

    # --- derived -----------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def batch_size(self) -> int:
        """The global batch: samples per optimizer step over the whole job."""
        if self.global_batch_size is None:
            return self.micro_batch_size * self.layout.data
        return self.global_batch_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-steps per optimizer step: global / (micro-batch x data-parallel)."""
        per_step = self.micro_batch_size * self.layout.data
        if self.batch_size % per_step:
            raise HarnessError(
                f"global_batch_size {self.batch_size} is not a multiple of micro_batch_size "
                f"{self.micro_batch_size} x data-parallel {self.layout.data} = {per_step}; "
                f"set global_batch_size to a multiple of {per_step}"
            )
        return self.batch_size // per_step

    def validate(self, where: str) -> None:
        if self.global_batch_size is not None and not 1 <= self.global_batch_size <= 2**30:
            raise HarnessError(f"{where}.global_batch_size: must be between 1 and 2^30")
        for name, settings in self.strategies.items():
            if not isinstance(settings, dict):
                raise HarnessError(
                    f"{where}.strategies.{name}: expected a table of settings, "
                    f"e.g. [strategies.{name}]"
                )
        if self.warmup_max_steps is not None and not 0 <= self.warmup_max_steps <= 10**6:
            raise HarnessError(f"{where}.warmup_max_steps: must be between 0 and 10^6 "
                               f"(leave it out for the default: 50 on CUDA)")
        if self.min_window_s is not None and not 0 <= self.min_window_s <= 86400:
            raise HarnessError(f"{where}.min_window_s: must be between 0 and 86400 seconds "
                               f"(leave it out for the default: 2 on CUDA, 0 on a CPU)")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise HarnessError(f"{where}.memory_budget_bytes: must be at least 1 byte "
                               f"(leave it out for no cap)")
        if self.save is not None and self.world_size > 1:
            raise HarnessError(f"{where}.save: the trained weights are saved from a plan in "
                               "one process; drop save or run it with layout 1 x 1 x 1")
        if self.cluster is not None:
            self.cluster.check_timeout(self.timeout_s, "timeout_s", f"{where}.cluster")

    # --- reading and writing ------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> Plan:
        data = copy.deepcopy(dict(data))
        args = split_workload(data, where)
        if args is not None:
            if "workload_args" in data:
                raise HarnessError(f"{where}: give workload arguments in [workload], not both")
            data["workload_args"] = args
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise HarnessError(
                    f"{where}: unknown key '{key}'{did_you_mean(key, known)}; "
                    f"known keys: {', '.join(sorted(known - {'workload_args'}))}"
                )
        return from_table(cls, data, where)

    def to_dict(self) -> dict[str, Any]:
        """The TOML form: workload arguments inside [workload]."""
        table = super().to_dict()
        table["layout"] = to_table(self.layout)
        return table
