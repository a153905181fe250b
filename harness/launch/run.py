"""Run one plan: the one way `harness bench`, each trial of `harness tune` and `harness
verify`'s bench go (docs/architecture.md#running-a-plan).

    result = run_plan(plan, out, command, cluster, nodes)

1. the plan is checked, resolved and estimated by the torch-side helper
   (training_harness.launch.torch_helper: this process never imports torch);
2. the launcher is the one the study or the plan's [cluster] names: this machine
   (training_harness.launch.local), or Slurm (training_harness.launch.slurm, checked
   with sbatch --test-only first); a study may bring its own;
3. `before_launch(prepared)`, where given, may keep the trial from starting (the tuner's
   budgets) or add to the launch's arguments (its timeout);
4. the launcher runs the ranks. How they start is decided there, once, from the plan and
   the nodes: on one node every rank is a fork of this command's rank server; on several
   nodes (and in a Slurm job's) torchrun starts them, a fresh interpreter each.

A plan or a node layout that cannot run is a HarnessError before anything is made.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_harness.core.cluster import ClusterSpec
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.prepared import PreparedPlan
from training_harness.launch import rank_server, torch_helper
from training_harness.launch.launcher import Launcher
from training_harness.launch.local import LocalLauncher, check_nodes, visible_gpus
from training_harness.records.result import TrialResult

# What may happen between the plan prepared and its launch: a record instead (the trial is
# not started), or more of the launch's arguments.
BeforeLaunch = Callable[[PreparedPlan], "TrialResult | dict[str, Any] | None"]


@dataclass(frozen=True)
class Nodes:
    """Where the plan's ranks run: how many nodes, this one's rank, the rendezvous."""

    count: int = 1
    rank: int = 0
    rdzv_endpoint: str | None = None

    def launch_kwargs(self) -> dict[str, Any]:
        return {"nnodes": self.count, "node_rank": self.rank,
                "rdzv_endpoint": self.rdzv_endpoint}


def launcher_for(cluster: ClusterSpec | None, prepared: PreparedPlan, nodes: Nodes) -> Launcher:
    """This machine's launcher, or Slurm's once it would take the plan's job."""
    plan = prepared.plan
    if cluster is None or cluster.launcher != "slurm":
        check_nodes(plan, nodes.count, nodes.rank, nodes.rdzv_endpoint, visible_gpus(prepared))
        return LocalLauncher()
    if nodes.rank or nodes.rdzv_endpoint:
        raise HarnessError("--node-rank and --rdzv-endpoint are for the local launcher: a "
                           "Slurm job gets all of its nodes at once")
    from training_harness.launch import slurm

    return slurm.launcher_for(cluster, prepared.device_type, [plan.world_size],
                              plan.timeout_s, nodes.count)


def run_plan(plan: Plan, out: Path, command: str, cluster: ClusterSpec | None = None,
             nodes: Nodes = Nodes(), *, launcher: Launcher | None = None,
             helper: torch_helper.TorchHelper | None = None,
             peaks: dict[str, Any] | None = None, phases: Any = None,
             before_launch: BeforeLaunch | None = None, starting: Callable[[PreparedPlan], None]
             | None = None, **launch_kwargs: Any) -> TrialResult:
    """Prepare `plan`, then launch it into `out` (see the module). `launcher`: the study's
    (else the cluster's); `helper`: the study's torch-side helper (else this process's);
    `phases`: a BenchPhases that gets the preparation's phases; `starting(prepared)` is
    told just before the ranks start."""
    if helper is None:
        if (cluster is None or cluster.launcher != "slurm") and nodes.count == 1:
            rank_server.warm_up(study=False)  # the ranks will fork from it: torch once
        helper = torch_helper.shared()
    measured: dict[str, float] = {}
    prepared = helper.prepare(plan, peaks, measured)
    if phases is not None:
        phases.add(measured, rest="helper")
    launcher = launcher or launcher_for(cluster, prepared, nodes)
    kwargs = {**(nodes.launch_kwargs() if nodes.count > 1 or nodes.rank else {}),
              **launch_kwargs}
    if before_launch is not None:
        decided = before_launch(prepared)
        if isinstance(decided, TrialResult):
            return decided
        kwargs.update(decided or {})
    if starting is not None:
        starting(prepared)
    return launcher.launch(prepared, out, command, **kwargs)


def bench_command(out: Path, nodes: Nodes, launcher: str | None, on_slurm: bool) -> str:
    """The command that re-runs a bench into `out` (the record's `command`)."""
    command = f"harness bench {shlex.quote(str(out / 'plan.toml'))} --out {shlex.quote(str(out))}"
    if nodes.count > 1:
        command += f" --nnodes {nodes.count}"
        if not on_slurm:
            command += (f" --node-rank {nodes.rank}"
                        f" --rdzv-endpoint {shlex.quote(str(nodes.rdzv_endpoint))}")
    return command + (f" --launcher {launcher}" if launcher else "")
