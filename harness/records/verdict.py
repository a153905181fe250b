"""A study's verdict: the best against the baseline, what each technique bought, and
whether the machine drifted, all from the same pooled measurements.

The summary the tuner prints, best.toml's comment, the report's headline and its
ablation table all read this one object, so they cannot tell two stories: the best's
figure is its configuration's pooled measurements (training_harness.records.pooled), the
baseline's likewise, and each technique's effect is the best's pool against the pool of
the configuration without it; where that configuration is the baseline's, it is the very
same comparison. Every ratio carries its interval and verdict (training_harness.records.speedup).

One rule keeps the two in agreement where they are different comparisons: a best whose
every technique the ablation finds within the noise is not called faster than the
baseline (the lead is held back, and the headline says why).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from training_harness.records.drift import Drift, drift
from training_harness.records.pooled import Pooled, compare, config_key, pool, pool_of
from training_harness.records.speedup import FASTER, SAME, SLOWER, Ratio
from training_harness.records.tags import tags_of

BASELINE_NAME = "the strict fp32 baseline"
HELD = "no speedup claimed at this n"  # a clear lead no technique accounts for alone


@dataclass
class Technique:
    name: str
    without: Pooled | None  # the best's configuration with it turned off, measured
    ratio: Ratio | None  # the best over that: what the technique bought
    failures: dict[str, int] = field(default_factory=dict)  # status -> count, without it

    def as_dict(self) -> dict[str, Any]:
        return {"technique": self.name, "failures": self.failures,
                "without": self.without.summary() if self.without else None,
                "ratio": self.ratio.as_dict() if self.ratio else None}


@dataclass
class StudyVerdict:
    best_id: str | None
    baseline_id: str | None
    best: Pooled | None = None
    baseline: Pooled | None = None
    versus_baseline: Ratio | None = None  # best over baseline; None: same or unmeasured
    techniques: list[Technique] = field(default_factory=list)
    drift: Drift | None = None
    held_back: bool = False  # faster by its interval, but no technique is beyond the noise

    @property
    def same_configuration(self) -> bool:
        return self.best is not None and self.baseline is not None and (
            self.best.key == self.baseline.key)

    @property
    def verdict(self) -> str | None:
        """FASTER, SLOWER or SAME for the best over the baseline (None: no comparison)."""
        if self.versus_baseline is None:
            return None
        return SAME if self.held_back else self.versus_baseline.verdict

    @property
    def said(self) -> str | None:
        """The verdict in words (training_harness.records.speedup.Ratio.said)."""
        r = self.versus_baseline
        if self.held_back:
            return HELD
        return r.said if r is not None and r.lo is None else self.verdict

    def headline(self) -> str:
        """The first sentence: what the best is worth against the baseline."""
        r = self.versus_baseline
        if self.same_configuration:
            return (f"The best configuration is {BASELINE_NAME} itself: no configuration "
                    "measured was faster.")
        if r is None:
            return ""
        detail = f"{r.estimate:.2f}x ({r.interval}, {r.basis})"
        if self.verdict == FASTER:
            return (f"The best configuration trains {r.estimate:.2f}x as fast as {BASELINE_NAME} "
                    f"({r.interval}, {r.basis}).")
        if self.verdict == SLOWER:
            return (f"The best configuration named by the search ran slower than "
                    f"{BASELINE_NAME} once every measurement is pooled: {detail}.")
        if r.lo is None:  # too few measurements for any interval: untested, not a tie
            return (f"The best configuration measured {r.estimate:.2f}x {BASELINE_NAME}, but "
                    f"too few times for a 95% interval ({r.basis}; a longer --budget measures "
                    "it again): no speedup is claimed at this n.")
        if self.held_back:  # SAME by rule (issue 38), though its own interval is clear
            return (f"The best configuration measured {detail} against {BASELINE_NAME}, but "
                    "the ablation finds none of its techniques beyond the noise alone, so "
                    "no speedup is claimed at this n.")
        return (f"The best configuration is not distinguishable from {BASELINE_NAME} at this "
                f"n: {detail}.")

    def as_dict(self) -> dict[str, Any]:
        """As study.json keeps it ("verdict")."""
        return {
            "best_id": self.best_id, "baseline_id": self.baseline_id,
            "best": self.best.summary() if self.best else None,
            "baseline": self.baseline.summary() if self.baseline else None,
            "versus_baseline": self.versus_baseline.as_dict() if self.versus_baseline else None,
            "verdict": self.verdict, "held_back": self.held_back, "headline": self.headline(),
            "techniques": [t.as_dict() for t in self.techniques],
            "drift": self.drift.text() if self.drift and self.drift.named else None,
        }


def study_verdict(records: list[dict[str, Any]], best_id: Any, baseline_id: Any) -> StudyVerdict:
    """The verdict of a study's records, its best trial `best_id` against its baseline
    trial `baseline_id` (either may be None)."""
    pools = pool(records)
    out = StudyVerdict(None if best_id is None else str(best_id),
                       None if baseline_id is None else str(baseline_id))
    if out.best_id is not None:
        out.best = pool_of(records, out.best_id, pools)
    if out.baseline_id is not None:
        out.baseline = pool_of(records, out.baseline_id, pools)
    if out.best is not None and out.baseline is not None and not out.same_configuration:
        out.versus_baseline = compare(out.best, out.baseline)
    if out.best_id is not None:
        out.techniques = techniques(records, out.best_id, out.best, pools)
    out.drift = drift(pools)
    effects = [t.ratio for t in out.techniques if t.ratio is not None]
    needed = any(t.ratio is None and t.failures for t in out.techniques)
    out.held_back = bool(out.versus_baseline and out.versus_baseline.verdict == FASTER
                         and effects and not needed
                         and all(e.verdict == SAME for e in effects))
    return out


def techniques(records: list[dict[str, Any]], best_id: str, best: Pooled | None,
               pools: dict[str, Pooled]) -> list[Technique]:
    """Each technique the ablation of trial `best_id` turned off: the best's pool over the
    pool of the configuration without it, or the statuses it ended with."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        tag = tags_of(r).get("ablation") or {}
        if str(tag.get("of")) == best_id and tag.get("without") is not None:
            groups.setdefault(str(tag["without"]), []).append(r)
    out = []
    for name in sorted(groups):
        group = groups[name]
        ok = next((r for r in group if r.get("status") == "ok"), None)
        without = pools.get(config_key(ok.get("plan"))) if ok else None
        failures = dict(Counter(r["status"] for r in group if r.get("status") != "ok"))
        r = compare(best, without) if best is not None and without is not None else None
        out.append(Technique(name, without, r, failures))
    return out


__all__ = ["FASTER", "HELD", "SAME", "SLOWER", "StudyVerdict", "Technique", "study_verdict"]
