"""A tiny GPT whose Slurm jobs wait for their tuner's gate.

    [workload]
    name = "tests.slurm.held_workload:build"
    hold_dir = "/tmp/x/held"    # each job writes <hold_dir>/<worker>/<job id> at its first batch

<worker> is the submitting tuner's $HARNESS_WORKER_HOST (the job inherits its
environment). Each job waits until the file <hold_dir>/<worker>/go exists. So a test
knows, without timing anything, that each tuner holds a trial inside a running job
(both of its nodes: the rank that waits stalls the other in its first collective), for
as long as it takes to kill the tuner and resume it. Past `wait_s` the batch raises (the trial
is `failed`, saying why). Outside a Slurm job (the tuner's own checks) nothing waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from training_harness.workloads.base import Workload
from training_harness.workloads.gpt import build_gpt


def build(hold_dir: str, wait_s: float = 150.0, **gpt_args: Any) -> Workload:
    workload = build_gpt(**gpt_args)
    batch, waited = workload.batch, []

    def held_batch(batch_size: int, index: int, device: Any) -> Any:
        job = os.environ.get("SLURM_JOB_ID")
        if job and not waited:
            waited.append(job)
            _hold(Path(hold_dir) / os.environ.get("HARNESS_WORKER_HOST", "none"), job, wait_s)
        return batch(batch_size, index, device)

    workload.batch = held_batch  # type: ignore[method-assign]
    return workload


def _hold(folder: Path, job: str, wait_s: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / job).write_text(f"{os.getpid()}\n")  # both nodes' ranks: the same file
    give_up = time.monotonic() + wait_s
    while not (folder / "go").exists():
        if time.monotonic() > give_up:
            raise RuntimeError(f"job {job}: gate {folder / 'go'} closed for {wait_s:g}s")
        time.sleep(0.2)
