"""What a study needs to know about this machine, learnt once without torch in the tuner.

The tuner's torch-side helper (training_harness.launch.torch_helper, serving from
training_harness.measure.torch_helper_server) checks the study against the strategy registry and
this device, and answers with these facts: the device, its memory, each listed
strategy's resolved search space, and every strategy's default settings (so the
tuner can write a plan's settings out in full, as the trial will run them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training_harness.core.plan import Plan
from training_harness.core.space import SettingsSpace


@dataclass
class MachineFacts:
    device_type: str  # "cpu" or "cuda"
    device_name: str
    device_count: int  # CUDA devices visible here (1 on a CPU)
    device_memory_bytes: int  # one device's memory (this machine's RAM on a CPU)
    settings: dict[str, SettingsSpace] = field(default_factory=dict)  # per listed strategy
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)  # every strategy's
    known_good: dict[str, Any] | None = None  # the study's [known_good], normalised
    env: dict[str, Any] = field(default_factory=dict)  # for records made in the tuner
    # The study's MFU denominators, fixed at its start: PeakChoice records by compute
    # dtype ("fp32", "bf16", "fp16"); study.json keeps them, so a resumed study and
    # its helper workers divide by the same figures.
    peaks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # When this device's profile (`harness calibrate`) was measured, or "" for none: the
    # estimator then costs a step at the datasheet's peak and an assumed MFU, the same at
    # every micro-batch, and the search's first guesses cannot rank micro-batches
    profile_measured: str = ""

    def resolved(self, plan: Plan) -> Plan:
        """`plan` with every strategy's settings written out in full (defaults filled),
        as strategies.resolved writes them in the trial."""
        return plan.replace(strategies={
            name: {**self.defaults.get(name, {}), **settings}
            for name, settings in plan.strategies.items()})

    def to_json(self) -> dict[str, Any]:
        return {"device_type": self.device_type, "device_name": self.device_name,
                "device_count": self.device_count,
                "device_memory_bytes": self.device_memory_bytes,
                "settings": {k: v.to_json() for k, v in self.settings.items()},
                "defaults": self.defaults, "known_good": self.known_good, "env": self.env,
                "peaks": self.peaks, "profile_measured": self.profile_measured}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineFacts:
        return cls(data["device_type"], data["device_name"], data["device_count"],
                   data["device_memory_bytes"],
                   {k: SettingsSpace.from_json(v) for k, v in data["settings"].items()},
                   data["defaults"], data["known_good"], data["env"], data.get("peaks") or {},
                   data.get("profile_measured", ""))
