"""A study checked against this machine and ready to run (made by `harness tune`'s checks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training_harness.launch.launcher import Launcher
from training_harness.launch.torch_helper import TorchHelper
from training_harness.study.machine_facts import MachineFacts
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study


@dataclass
class CheckedStudy:
    study: Study
    space: SearchSpace
    facts: MachineFacts  # the device and the strategies' spaces, from the probe
    torch_helper: TorchHelper  # the torch-side helper that prepares each trial's plan
    run_dir: Path
    budget_bytes: int
    references: list[tuple[str, dict[str, Any]]]  # (phase, params) enqueued first
    launcher: Launcher  # LocalLauncher, SlurmLauncher, or a user's function (FunctionLauncher)
    groups: list[str | None]  # CUDA_VISIBLE_DEVICES per worker (None: all, or a CPU)
    started: float

    @property
    def device_type(self) -> str:
        return self.facts.device_type
