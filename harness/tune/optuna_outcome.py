"""What Optuna is told of a record: its state, values and constraints.

Every finished trial gets two constraints (`Trial.set_constraint`; > 0 is violated):
`memory`, the bytes over the memory budget (negative: the room left), and `runs`,
CANNOT_RUN for a configuration that cannot run. An infeasible configuration is COMPLETE
with the worst values and a violated constraint, not FAIL: samplers skip FAIL trials and
would propose it again. FAIL is kept for what says nothing of the configuration (the
study's deadline, no time to start it, an orphan, a busy machine's figure). Every phase
tells Optuna so (training_harness.tune.recorder); the table of every case: docs/tuning.md ("TPE
by default, with the memory budget as a constraint").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from training_harness.core.memory_need import budget_peak_bytes
from training_harness.records.tags import PRUNED_MEMORY, PRUNED_SLOW, PRUNED_TIME, tags_of

CANNOT_RUN = 2.0**60  # the "runs" constraint's violation, in the memory's unit (bytes)
OOM_AT_LEAST = 2.0**20  # an OOM whose peak and prediction fit: over by at least 1 MiB


@dataclass
class Outcome:
    state: TrialState
    values: list[float] | None
    constraints: dict[str, float]

    @property
    def feasible(self) -> bool:
        return self.state == TrialState.COMPLETE and all(
            v <= 0 for v in self.constraints.values())


def _predicted_peak(record: dict[str, Any]) -> float | None:
    predicted = record.get("predicted") or {}
    return predicted.get("calibrated_peak_memory_bytes", predicted.get("peak_memory_bytes"))


def memory_excess_bytes(record: dict[str, Any], budget_bytes: float) -> float:
    """How far over the memory budget a record's configuration is, in bytes (negative:
    the room left; 0 where nothing says). Measured peak for a trial that ran, the
    corrected prediction for one not launched, either for an OOM (at least 1 MiB)."""
    status, tags = record["status"], tags_of(record)
    peak = (record.get("metrics") or {}).get("peak_memory_bytes")
    predicted_peak = _predicted_peak(record)
    if status == "ok":  # what it needed, where it ran under the allocator's cap
        needed = budget_peak_bytes(record)
        return needed - budget_bytes if needed else 0.0
    if status == "pruned" and tags.get("pruned") == PRUNED_MEMORY:
        return max(float(predicted_peak) - budget_bytes, 1.0) if predicted_peak else OOM_AT_LEAST
    if status == "oom":
        known = [float(n) for n in (peak, predicted_peak) if n]
        return max([n - budget_bytes for n in known] + [OOM_AT_LEAST])
    return 0.0


def outcome(record: dict[str, Any], objectives: list[str], budget_bytes: float) -> Outcome:
    """The Optuna state, values and constraints of a stored record."""
    status, tags = record["status"], tags_of(record)
    m = record.get("metrics") or {}
    peak, predicted_peak = m.get("peak_memory_bytes"), _predicted_peak(record)
    excess = memory_excess_bytes(record, budget_bytes)

    def worst(memory: float | None) -> list[float]:
        table = {"throughput": 0.0, "memory": float(max(memory or 0, budget_bytes)),
                 "time_to_loss": math.inf}
        return [table[o] for o in objectives]

    if status == "ok" and (m.get("interference") or {}).get("flagged"):
        return Outcome(TrialState.FAIL, None, {})
    if status == "ok":
        # time_to_loss: an ok record reached the target (a miss is "failed", below)
        table = {"throughput": float(m.get("samples_per_s") or 0.0),
                 "memory": float(peak or 0),
                 "time_to_loss": float(m.get("time_to_target_s") or math.inf)}
        return Outcome(TrialState.COMPLETE, [table[o] for o in objectives],
                       {"memory": excess, "runs": 0.0})
    why = tags.get("pruned")
    if status == "pruned" and why == PRUNED_SLOW:
        # COMPLETE at the throughput the stop judged, not PRUNED: TPE ranks pruned
        # trials above every infeasible one and fills its "good" set with them when
        # few trials completed, so a slow configuration drew the sampler back to itself
        # (one 127,302-configuration replay ran the same one 326 times)
        stopped = (m.get("slow_stop") or {}).get("samples_per_s")
        if stopped and objectives == ["throughput"]:
            return Outcome(TrialState.COMPLETE, [float(stopped)], {"memory": 0.0, "runs": 0.0})
        return Outcome(TrialState.PRUNED, None, {"memory": 0.0, "runs": 0.0})
    if status == "pruned" and why == PRUNED_MEMORY:
        return Outcome(TrialState.COMPLETE, worst(predicted_peak), {"memory": excess,
                                                                    "runs": 0.0})
    if status == "oom":
        return Outcome(TrialState.COMPLETE, worst(peak or predicted_peak),
                       {"memory": excess, "runs": 0.0})
    if (status == "pruned" and why == PRUNED_TIME) or tags.get("deadline") or tags.get("orphan"):
        return Outcome(TrialState.FAIL, None, {})
    # refused here, failed, diverged, its own timeout: this configuration does not run
    return Outcome(TrialState.COMPLETE, worst(peak or predicted_peak),
                   {"memory": 0.0, "runs": CANNOT_RUN})


def tell(study: optuna.Study, trial: optuna.Trial, result: Outcome) -> None:
    """Set the trial's constraints, then its state and values (by its number)."""
    for key, value in result.constraints.items():
        trial.set_constraint(key, value)
    study.tell(trial.number, result.values, state=result.state)
