"""The "mlp" workload, whose trials inside Slurm jobs wait for each other, or for a gate.

    [workload]
    name = "tests.slurm.meet_workload:build"
    meet_dir = "/tmp/x/met"     # each job's first training step writes <job id> here...
    meet = 2                    # ...and waits until this many jobs have written theirs
    gate = "/tmp/x/go"          # ...and, if given, until this file exists (or, for one
                                # job alone, "/tmp/x/go.<job id>")

So a test knows without timing anything that two jobs ran at once (the first two
trials can only finish together), or holds a trial inside its job while it kills the
tuner. Past `wait_s` the step raises (the trial is `failed`, saying why). Outside a
Slurm job (the tuner's checks) and on the meta device nothing waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from training_harness.workloads.base import Workload
from training_harness.workloads.mlp import build_mlp


def build(meet_dir: str, meet: int = 2, gate: str | None = None, wait_s: float = 60.0,
          **mlp_args: Any) -> Workload:
    workload = build_mlp(**mlp_args)
    loss, met = workload.loss, []

    def meeting_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        real = not any(t.device.type == "meta" for t in tree_leaves(batch) if torch.is_tensor(t))
        job = os.environ.get("SLURM_JOB_ID")
        if real and job and not met:
            met.append(job)
            _meet(Path(meet_dir), job, meet, Path(gate) if gate else None, wait_s)
        return loss(model, batch)

    workload.loss = meeting_loss  # type: ignore[method-assign]
    return workload


def _meet(folder: Path, job: str, meet: int, gate: Path | None, wait_s: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / job).write_text(f"{os.getpid()}\n")
    give_up = time.monotonic() + wait_s
    own = gate.with_name(f"{gate.name}.{job}") if gate is not None else None
    while len(list(folder.iterdir())) < meet or (
            gate is not None and not gate.exists() and not own.exists()):  # type: ignore[union-attr]
        if time.monotonic() > give_up:
            raise RuntimeError(f"job {job}: {len(list(folder.iterdir()))} of {meet} jobs met "
                               f"in {wait_s:g}s" + (f", gate {gate} closed" if gate else ""))
        time.sleep(0.2)
