"""A plan checked once, with everything its trial needs computed: the prepared plan.

    plan.toml       what to run (harness bench re-runs it)
    prepared.json   this file: the plan checked against the machine and resolved
                    (every setting filled in), the estimator's prediction, the
                    model FLOPs per sample, the peak MFU divides by, the device,
                    and the environment a record made without the trial carries

It is made once per trial, by whoever checks the plan: `harness bench` in its own
process, the tuner through its torch-side helper (training_harness.launch.torch_helper). The
launcher writes it beside plan.toml, and every rank reads it instead of checking,
estimating and counting FLOPs again. Plain data: no torch here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training_harness.core.plan import Plan

PREPARED_VERSION = 1


@dataclass
class PreparedPlan:
    plan: Plan  # checked here and resolved: every strategy's settings written out
    predicted: dict[str, Any] | None  # training_harness.estimator's record
    flops_per_sample: float  # model FLOPs of one sample's forward and backward
    tokens_per_sample: int | None  # None for workloads without tokens
    peak: dict[str, Any]  # the peak FLOP/s MFU divides by, both sources (PeakChoice record)
    device_type: str
    device_name: str
    env: dict[str, Any] = field(default_factory=dict)  # versions, host, devices

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan"] = self.plan.to_dict()
        return {"version": PREPARED_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedPlan:
        data = {k: v for k, v in data.items() if k != "version"}
        data["plan"] = Plan.from_dict(data["plan"], where="prepared.json")
        return cls(**data)

    def write(self, path: str | Path) -> None:
        """Whole or not at all: several nodes' launchers may share the folder."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=str))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: str | Path) -> PreparedPlan:
        return cls.from_dict(json.loads(Path(path).read_text()))
