"""Study files: what `harness tune` searches, under which budgets.

A study names a workload, the device, the world sizes and layouts allowed, the
micro-batch candidates and the global batch, the strategies to search (and which
of their settings), the objective and the budgets. It is read from TOML and
checked whole before anything runs; a mistake is a HarnessError naming the key.
Each key's meaning is the docstring under its field (`harness tune --keys` lists
them all; training_harness.study.keys reads them).

Checks that need the registry and this machine (strategy names and settings,
what the layouts need) are in training_harness.study.checks.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from training_harness.core.cluster import ClusterSpec
from training_harness.core.config import (
    TomlFile,
    bounded,
    did_you_mean,
    from_table,
    split_workload,
)
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, OptimizerSettings
from training_harness.core.units import parse_bytes, parse_duration
from training_harness.study.storage_spec import StorageSpec
from training_harness.study.target_search import StudyTarget, check_target

OBJECTIVES = {"throughput": "maximize", "memory": "minimize", "time_to_loss": "minimize"}
MAX_MICRO = 2**24  # as a plan's micro_batch_size


@dataclass
class MicroRange:
    """Micro-batch candidates min, 2·min, 4·min, ... up to max."""

    min: int
    max: int

    def validate(self, where: str) -> None:
        if not 1 <= self.min <= MAX_MICRO:
            raise HarnessError(f"{where}.min: must be between 1 and {MAX_MICRO}")
        if not self.min <= self.max <= MAX_MICRO:
            raise HarnessError(f"{where}.max: must be between min ({self.min}) and {MAX_MICRO}")

    def values(self) -> list[int]:
        out, m = [], self.min
        while m <= self.max:
            out.append(m)
            m *= 2
        return out


@dataclass
class LayoutSpec:
    """The parallel layouts allowed: data = world size / (pipeline x tensor)."""

    world_sizes: list[int] = field(default_factory=lambda: [1])
    """Ranks of a trial (devices, or processes on a CPU) to search over."""
    pipeline: list[int] = field(default_factory=lambda: [1])
    """Pipeline stage counts allowed; only those whose pipeline x tensor divides a world size."""
    tensor: list[int] = field(default_factory=lambda: [1])
    """Tensor-parallel sizes allowed."""
    nnodes: int = bounded(1, 1, 2**16)
    """Nodes every trial spans, torchrun on each; world sizes must be multiples of it."""

    def validate(self, where: str) -> None:
        for key, top in (("world_sizes", 2**20), ("pipeline", 4096), ("tensor", 4096)):
            values = getattr(self, key)
            if not values:
                raise HarnessError(f"{where}.{key}: give at least one value")
            if any(not 1 <= v <= top for v in values):
                raise HarnessError(f"{where}.{key}: every value must be between 1 and {top}")
        if bad := [w for w in self.world_sizes if w % self.nnodes]:
            raise HarnessError(
                f"{where}.world_sizes: {bad[0]} ranks do not split evenly over nnodes = "
                f"{self.nnodes}; use multiples of {self.nnodes}"
            )
        if not self.layouts():
            raise HarnessError(
                f"{where}: no layout fits: no pipeline x tensor of {self.pipeline} x "
                f"{self.tensor} divides a world size of {self.world_sizes}; "
                "allow sizes whose product divides a world size"
            )

    def layouts(self) -> list[Layout]:
        axes = (sorted(set(v)) for v in (self.world_sizes, self.pipeline, self.tensor))
        return [Layout(data=w // (p * t), pipeline=p, tensor=t)
                for w, p, t in itertools.product(*axes) if w % (p * t) == 0]


@dataclass
class BudgetSpec:
    """The time and memory the study may use, and how its final phases share the time."""

    time: str | float = "1h"
    """The study's wall clock: 90s, 30m, 6h, 1d, or seconds (--budget overrides it)."""
    memory: str | float = 0.9
    """Peak memory per device: a size ("70GiB") or a fraction of the device's (--memory-budget)."""
    trial_timeout: str | float = "15m"
    """Each trial's own time limit."""
    n_trials: int = bounded(0, 0, 10**7)
    """Search trials at most (0: as many as the time allows; --n-trials overrides it)."""
    ablation_share: float = bounded(0.15, 0.0, 0.95)
    """The share of the time kept at most for the final phases: confirmation and ablation."""
    ablation_repeats: int = bounded(3, 0, 1000)
    """Runs of each ablation configuration: the best, and the best without each technique."""
    confirm_repeats: int = bounded(2, 0, 1000)
    """Rounds that measure the contenders and the baseline again before a best is named (0: off)."""
    confirm_margin: float = bounded(0.2, 0.0, 1.0)
    """Contenders: the configurations within this fraction of the fastest (the two fastest
    always, at most four)."""
    expandable_segments: bool = True
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in each trial's environment."""
    variants: bool = True
    """With a budget of 1h or more and time to spare: measure the best with each precision and
    compile mode its space left out."""

    def validate(self, where: str) -> None:
        parse_duration(self.time, f"{where}.time")
        parse_duration(self.trial_timeout, f"{where}.trial_timeout")
        memory_spec(self.memory, f"{where}.memory")

    @property
    def time_s(self) -> float:
        return parse_duration(self.time, "budget.time")

    @property
    def trial_timeout_s(self) -> float:
        return parse_duration(self.trial_timeout, "budget.trial_timeout")


def memory_spec(value: str | float, what: str = "memory budget") -> tuple[str, float]:
    """("fraction", f) for 0 < f <= 1, or ("bytes", n) for a size."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        try:
            number = float(str(value).strip())
        except ValueError:
            n = parse_bytes(str(value), what)
            if n <= 0:
                raise HarnessError(f"{what} {value!r}: must be above 0") from None
            return "bytes", float(n)
    if not 0 < number < math.inf:
        raise HarnessError(f"{what} {value!r}: must be finite and above 0 (a size such as "
                           "70GiB, or a fraction of the device's memory such as 0.9)")
    return ("fraction", number) if number <= 1 else ("bytes", number)


@dataclass
class PruningSpec:
    """When a search trial is stopped early for being clearly slower than the best."""

    slower_than: float = bounded(2.0, 0.0, 1e6)
    """Stop a trial this many times slower than the best so far (0: never)."""
    min_steps: int = bounded(3, 1, 10**6)
    """Measured steps a trial runs before it may be stopped."""

    def validate(self, where: str) -> None:
        if self.slower_than != 0 and self.slower_than < 1:
            raise HarnessError(f"{where}.slower_than: must be 0 (never) or at least 1")


@dataclass
class StrategySpec:
    """How one strategy (`harness strategies` lists them) is searched: on and off, with its
    settings."""

    search: list[str] | None = None
    """The settings searched (unset: all of its space; [] none)."""
    values: dict[str, Any] = field(default_factory=dict)
    """Narrowed values per setting: { optimizer = ["foreach", "fused"] }; { low, high } for a
    range."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Settings held at one value: { compile = false }."""
    always: bool = False
    """On in every trial instead of searched on and off; its settings are still searched."""


@dataclass
class Study(TomlFile):
    """The study's own keys, above its tables."""

    name: str
    """The study's name: its run folder is runs/<name>/."""
    workload: str = "gpt"
    """A [workload] table: name (gpt, vit, resnet, mlp, hf:llama, package.module:function) and
    the workload's arguments (docs/models.md)."""
    workload_args: dict[str, Any] = field(default_factory=dict)
    """The [workload] table's keys other than name."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where trials run; auto: CUDA when present, else the CPU."""
    objective: str | list[str] = "throughput"
    """throughput (samples/s), memory (peak) or time_to_loss; two of them: a Pareto front."""
    sampler: Literal["auto", "tpe", "nsga2", "random", "grid"] = "auto"
    """auto: the GuidedSampler (with TPE) for one objective, NSGA-II for two; tpe: the same."""
    seed: int = bounded(0, 0, 2**32 - 1)
    """Seeds the samplers, so a study proposes the same trials again."""
    global_batch_size: int | list[int] = bounded(8, 1, 2**30)
    """Samples per optimizer step, fixed: the search never changes what is trained (a list is
    searched, only with objective time_to_loss)."""
    micro_batch_sizes: list[int] | MicroRange = field(default_factory=lambda: [1, 2, 4, 8])
    """Micro-batch candidates, or { min, max }: the powers of two min, 2 min, ... up to max."""
    warmup_steps: int = bounded(3, 0, 10**6)
    """Steps each trial runs before its measured steps."""
    steps: int = bounded(10, 1, 10**6)
    """Measured steps per trial."""
    layout: LayoutSpec = field(default_factory=LayoutSpec)
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    pruning: PruningSpec = field(default_factory=PruningSpec)
    storage: StorageSpec = field(default_factory=StorageSpec)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    strategies: dict[str, StrategySpec] = field(default_factory=dict)
    known_good: dict[str, Any] | None = None
    """Tried second, after the fp32 baseline: micro_batch_size, layout, strategies (unset: fused
    kernels, plus bf16 on a GPU)."""
    cluster: ClusterSpec | None = None
    target_loss: float | None = None
    """The validation loss to reach, with objective time_to_loss."""
    target: StudyTarget = field(default_factory=StudyTarget)

    def validate(self, where: str) -> None:
        if not self.name or any(c in self.name for c in "/\\ ") or self.name.startswith("."):
            raise HarnessError(f"{where}.name: {self.name!r} must be a folder name "
                               "(no spaces or slashes)")
        for obj in self.objectives:
            if obj not in OBJECTIVES:
                raise HarnessError(f"{where}.objective: {obj!r} is not one of "
                                   f"{', '.join(map(repr, OBJECTIVES))}")
        if len(set(self.objectives)) != len(self.objectives) or not self.objectives:
            raise HarnessError(f"{where}.objective: give one objective, or two different ones")
        if any(not 1 <= m <= MAX_MICRO for m in self.micro_sizes):
            raise HarnessError(f"{where}.micro_batch_sizes: every value must be between 1 "
                               f"and {MAX_MICRO}")
        if not self.micro_sizes:
            raise HarnessError(f"{where}.micro_batch_sizes: give at least one value")
        if self.cluster is not None:
            self._check_cluster(self.cluster, where)
        if not self.global_batches or any(not 1 <= g <= 2**30 for g in self.global_batches):
            raise HarnessError(f"{where}.global_batch_size: each must be between 1 and 2^30")
        check_target(self, where)

    def _check_cluster(self, cluster: ClusterSpec, where: str) -> None:
        cluster.check_timeout(self.budget.trial_timeout_s, "budget.trial_timeout",
                              f"{where}.cluster")
        nnodes = self.layout.nnodes
        if cluster.launcher == "slurm" and nnodes > 1 and cluster.gpus_per_node and any(
                w // nnodes > cluster.gpus_per_node for w in self.layout.world_sizes):
            raise HarnessError(
                f"{where}.layout.nnodes: {max(self.layout.world_sizes)} ranks on {nnodes} nodes "
                f"need more than gpus_per_node = {cluster.gpus_per_node} a node; raise nnodes "
                "(or leave it at 1: each job then gets the nodes its layout needs)")

    @property
    def objectives(self) -> list[str]:
        return [self.objective] if isinstance(self.objective, str) else list(self.objective)

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]

    @property
    def global_batches(self) -> list[int]:
        g = self.global_batch_size
        return sorted(set(g)) if isinstance(g, list) else [g]

    @property
    def micro_sizes(self) -> list[int]:
        m = self.micro_batch_sizes
        return sorted(set(m.values() if isinstance(m, MicroRange) else m))

    # --- reading and writing ------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "study") -> Study:
        data = copy.deepcopy(dict(data))
        args = split_workload(data, where)
        if args is not None:
            data["workload_args"] = args
        raw_strategies = data.pop("strategies", {})
        if not isinstance(raw_strategies, dict):
            raise HarnessError(f"{where}.strategies: expected tables such as [strategies.amp]")
        known = {f.name for f in dataclasses.fields(cls)} - {"workload_args"}
        for key in data.keys() - {"workload_args"}:
            if key not in known:
                raise HarnessError(f"{where}: unknown key '{key}'{did_you_mean(key, known)}; "
                                   f"known keys: {', '.join(sorted(known))}")
        if "name" not in data:
            raise HarnessError(f"{where}: missing key 'name' (the study's name; its run folder)")
        study = from_table(cls, data, where)
        study.strategies = {
            name: from_table(StrategySpec, table, f"{where}.strategies.{name}")
            for name, table in raw_strategies.items()
        }
        check_target(study, where)  # again, now with the strategies
        return study
