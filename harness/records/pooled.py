"""One figure per configuration: every measurement of the same resolved configuration,
from any phase (baseline, search, confirmation rounds, ablation, variants, a resumed
session's), pooled into one median with its spread and n.

A study measures its contenders several times under several names: the baseline's
configuration is also the ablation's "without fused" when the best's one technique is
fused. Each phase's figure alone tells its own story; pooled, they tell one. Two plans
are the same configuration when everything but how long it was measured (the window,
steps, warm-up, timeout, seed) and the study's own settings (name, memory cap) agree.

Only measurements that stand for their configuration count: status ok, taken on a
quiet machine (not flagged busy), not a copy of another trial's record (duplicate_of).
Each measurement keeps its pairing: a confirmation round's or an ablation repeat's
measurements were taken close together, and training_harness.records.speedup pairs them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from training_harness.records.predicates import busy_note
from training_harness.records.speedup import Ratio, ratio
from training_harness.records.tags import ABLATION, CONFIRM, tags_of

FIGURE = "samples_per_s"
# how long and with what seed a configuration was measured, and the study's settings:
# not what makes it a configuration
NOT_CONFIGURATION = ("name", "memory_budget_bytes", "expandable_segments", "min_window_s",
                     "steps", "warmup_steps", "warmup_max_steps", "timeout_s", "seed", "save")


def config_key(plan: dict[str, Any] | None) -> str:
    """What makes two recorded plans the same configuration."""
    table = {k: v for k, v in (plan or {}).items() if k not in NOT_CONFIGURATION}
    return json.dumps(table, sort_keys=True, default=str)


@dataclass(frozen=True)
class Measurement:
    value: float
    trial_id: str
    phase: str
    pair: Hashable | None  # measurements taken close together share it (a round)
    window_s: float | None  # the measured window's seconds, where recorded
    at: int  # its place in time among the study's measurements


@dataclass
class Pooled:
    key: str
    measurements: list[Measurement] = field(default_factory=list)  # in time order

    @property
    def values(self) -> list[float]:
        return [m.value for m in self.measurements]

    @property
    def n(self) -> int:
        return len(self.measurements)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    @property
    def phases(self) -> dict[str, int]:
        return dict(Counter(m.phase for m in self.measurements))

    @property
    def windows(self) -> tuple[float, float] | None:
        """The shortest and longest measured window, seconds (None where not recorded)."""
        w = [m.window_s for m in self.measurements if m.window_s]
        return (min(w), max(w)) if w else None

    def summary(self) -> dict[str, Any]:
        """As study.json keeps it: median, min, max, n, and where the n came from."""
        out: dict[str, Any] = {"median": self.median, "min": self.lo, "max": self.hi,
                               "n": self.n, "phases": self.phases}
        if self.windows:
            out["window_s"] = list(self.windows)
        return out

    def text(self) -> str:
        """'80.22 samples/s median [73.7, 85.08], n=5'."""
        return f"{self.median:.4g} samples/s median [{self.lo:.4g}, {self.hi:.4g}], n={self.n}"


def measurement_of(record: dict[str, Any], at: int) -> Measurement | None:
    """A record's measurement of its configuration, or None where it stands for none."""
    tags = tags_of(record)
    if record.get("status") != "ok" or busy_note(record) or "duplicate_of" in tags:
        return None
    m = record.get("metrics") or {}
    try:
        value = float(m.get(FIGURE))
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    phase = str(tags.get("phase") or "bench")
    pair: Hashable | None = None
    if phase == CONFIRM and "confirm" in tags:
        pair = (CONFIRM, tags["confirm"].get("round"))
    elif phase == ABLATION and "ablation" in tags:
        pair = (ABLATION, str(tags["ablation"].get("of")), tags["ablation"].get("repeat"))
    window = (m.get("window") or {}).get("seconds")
    return Measurement(value, str(record.get("trial_id")), phase, pair,
                       float(window) if isinstance(window, (int, float)) else None, at)


def in_time_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records by when they started (stored order where the second is the same)."""
    return sorted(records, key=lambda r: str(r.get("started_at") or ""))


def pool(records: list[dict[str, Any]]) -> dict[str, Pooled]:
    """Every configuration's pooled measurements, by config_key."""
    out: dict[str, Pooled] = {}
    for at, r in enumerate(in_time_order(records)):
        m = measurement_of(r, at)
        if m is not None:
            key = config_key(r.get("plan"))
            out.setdefault(key, Pooled(key)).measurements.append(m)
    return out


def pool_of(records: list[dict[str, Any]], trial_id: Any,
            pools: dict[str, Pooled] | None = None) -> Pooled | None:
    """The pooled measurements of trial `trial_id`'s configuration (None: none measured)."""
    record = next((r for r in records if str(r.get("trial_id")) == str(trial_id)), None)
    if record is None:
        return None
    pools = pool(records) if pools is None else pools
    return pools.get(config_key(record.get("plan")))


def compare(a: Pooled, b: Pooled) -> Ratio:
    """a's figure over b's, with its interval and verdict (training_harness.records.speedup): over
    the pairs taken close together where there are enough, else over every measurement."""
    return ratio(a.values, b.values, [m.pair for m in a.measurements],
                 [m.pair for m in b.measurements])
