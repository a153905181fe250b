"""TrialResult: the record of one trial (schema version 1), written whole or not at all."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
        "memory": {"allocated": None, "reserved": None, "nvml_used": None, "rss": None,
                   "cap_bytes": None},
        "energy_j_per_sample": None,
        "loss": {"first": None, "last": None, "finite": None},
        # who else used the machine during the measured steps (training_harness.core.interference)
        "interference": None,
    }


@dataclass
class TrialResult:
    """One trial's record: what was run (plan, command, env), what was predicted, what
    was measured (metrics, every key of schema 1; null where unmeasured), and how it
    ended (status, reason). On disk a plain JSON object (to_dict / from_dict).

    `tags`, beyond schema 1: where the trial came from in a study and what happened to
    it. The keys a record may carry (phase, optuna_number, pruned, deadline, orphan,
    unreachable, stale, retry_of, duplicate_of, remeasured, confirm, ablation,
    cluster), their values and meanings are training_harness.records.tags.Tags; a stored
    record's are read with tags_of, and the questions asked of records (finished,
    may_be_best, ...) are training_harness.records.predicates. A trial that measured nothing
    gets its record from `not_measured`.
    """

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
    tags: dict[str, Any] = field(default_factory=dict)  # training_harness.records.tags.Tags

    @classmethod
    def not_measured(cls, status: Status, reason: str, *, study: str | None,
                     trial_id: int | str | None, plan: dict[str, Any],
                     predicted: dict[str, Any] | None, env: dict[str, Any] | None = None,
                     command: str = "", started_at: str | None = None,
                     duration_s: float = 0.0, tags: dict[str, Any] | None = None,
                     metrics: dict[str, Any] | None = None) -> TrialResult:
        """The record of a trial that measured nothing: not launched (pruned), or
        launched and left no record of its own (failed, timeout, stopped). Its metrics
        are unmeasured (`metrics`: the few that are known, e.g. an exit code);
        `started_at` None: now."""
        return cls(
            study=study, trial_id=trial_id, status=status, reason=reason, plan=plan,
            predicted=predicted, metrics={**empty_metrics(), **(metrics or {})},
            env=env if env is not None else {}, command=command,
            started_at=(datetime.now(UTC).isoformat(timespec="seconds")
                        if started_at is None else started_at),
            duration_s=duration_s, tags=tags if tags is not None else {})

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
        except BaseException as e:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError) and e.filename is None:  # a full disk: say which file
                raise OSError(e.errno, e.strerror or str(e), str(path)) from e
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

