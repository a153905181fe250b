"""TrialResult: the record of one trial (schema version 1), written whole or not at all."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA_VERSION = 1
Status = Literal["ok", "oom", "failed", "timeout", "diverged", "pruned"]


def empty_metrics() -> dict[str, Any]:
    """Every metrics key of schema 1, unmeasured (null)."""
    return {
        "step_time_s": {"median": None, "p10": None, "p90": None, "n": 0},
        "samples_per_s": None,
        "tokens_per_s": None,
        "tflops_per_device": None,
        "mfu": None,
        "peak_flops_source": None,
        "peak_memory_bytes": None,
        "memory": {"allocated": None, "reserved": None, "nvml_used": None, "rss": None},
        "energy_j_per_sample": None,
        "loss": {"first": None, "last": None, "finite": None},
        # who else used the machine during the measured steps (harness.measure.interference)
        "interference": None,
    }


@dataclass
class TrialResult:
    study: str | None
    trial_id: int | str | None
    status: Status
    reason: str | None
    plan: dict[str, Any]
    predicted: dict[str, Any] | None
    metrics: dict[str, Any] = field(default_factory=empty_metrics)
    env: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    started_at: str = ""
    duration_s: float = 0.0
    schema: int = SCHEMA_VERSION
    # Beyond schema 1's keys: where the trial came from in a study, e.g.
    # {"phase": "baseline" | "known-good" | "search" | "ablation",
    #  "ablation": {"of": <trial_id>, "without": "<strategy>", "repeat": <i>}}
    tags: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"result schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def write(self, path: str | Path) -> Path:
        """Write atomically: a reader sees the old file or the whole new one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".result-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f, indent=2, allow_nan=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def read_result(path: str | Path) -> TrialResult:
    return TrialResult.from_dict(json.loads(Path(path).read_text()))


def _json_safe(obj: Any) -> Any:
    """NaN and infinities are not JSON: record them as strings, not as a crash."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def busy_note(record: dict[str, Any]) -> str | None:
    """Why a record's measurement is not to be trusted, when its trial was flagged as
    measured beside other work (metrics.interference, harness.measure.interference):
    "others used 54% of the CPUs; 1 other process on the GPU". None when it was quiet."""
    seen = (record.get("metrics") or {}).get("interference") or {}
    if not seen.get("flagged"):
        return None
    parts = [f"others used {seen.get('other_cpu_share') or 0:.0%} of the CPUs"]
    gpus = seen.get("other_gpu_processes") or []
    if gpus:
        parts.append(f"{len(gpus)} other process{'es' if len(gpus) > 1 else ''} on the GPU")
    return "; ".join(parts)
