"""What each technique bought: its effect on throughput and peak memory, with the spread.

From ablation records (the tuner's leave-one-out trials of the best configuration,
each technique turned off in turn and repeated): the throughput effect of technique T
is the best's configuration over the configuration without T, each every quiet
measurement of it in the study pooled, with its 95% interval and verdict
(training_harness.records.verdict: the very comparison the headline makes where the
configuration without T is the baseline's). An effect is *clear* only when that verdict
is faster or slower; within the noise threshold, or at too small an n, it is not. The
memory effect is the median of the ablation's own pairs (without - with), with their
smallest and largest.

With no ablation records the fallback compares search trials that differ in exactly
that one technique (everything else equal), labelled as such: they were not repeated,
and the spread is over the pairs found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from statistics import median

from training_harness.records.pooled import pool, pool_of
from training_harness.records.speedup import SAME, Ratio
from training_harness.records.verdict import techniques
from training_harness.reports.frame import strategies_of
from training_harness.reports.load import Run
from training_harness.reports.style import num


@dataclass
class Effect:
    technique: str
    source: str                       # "ablation" or "pairs"
    n: int = 0                        # measurements without it (ablation) or pairs found
    n_reference: int = 0
    speedup: float | None = None      # throughput with / without (x)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    memory_saved: float | None = None  # bytes: peak without - peak with
    memory_saved_lo: float | None = None
    memory_saved_hi: float | None = None
    clear: bool | None = None         # None: too few measurements to tell
    failures: dict[str, int] = field(default_factory=dict)  # status -> count, without it
    ratio: Ratio | None = None        # ablation: the pooled comparison, with its interval

    @property
    def verdict(self) -> str:
        if self.speedup is None:
            if self.failures:
                fails = ", ".join(f"{s} ×{n}" for s, n in self.failures.items())
                return f"needed: without it the configuration did not run ({fails})"
            return "no measurement without it"
        pct = (self.speedup - 1) * 100
        what = f"{'+' if pct >= 0 else ''}{pct:.1f}% throughput"
        if self.ratio is not None:
            r = self.ratio
            return f"{what} ({r.interval}, {r.basis}): {r.said}"
        if self.clear is None:
            return what + " (one measurement each: spread unknown)"
        return what + ("" if self.clear else " — within run-to-run spread (noise)")


@dataclass
class Effects:
    source: str                       # "ablation", "pairs" or "none"
    note: str
    items: list[Effect]


def technique_effects(run: Run) -> Effects:
    t = run.trials
    abl = t[t["phase"] == "ablation"]
    if len(abl):
        return _from_ablation(run, abl)
    items = _from_pairs(run)
    if items:
        return Effects("pairs", "No leave-one-out (ablation) trials in this study: each effect "
                       "below compares search trials that differ only in that technique, "
                       "measured once each — indicative, not repeated.", items)
    return Effects("none", "No leave-one-out (ablation) trials, and no two measured trials "
                   "that differ in exactly one technique: the effects cannot be shown.", [])


def _from_ablation(run: Run, abl) -> Effects:
    ok = abl[abl["status"] == "ok"]
    ref = ok[ok["ablation_without"].isna()]
    of = abl["ablation_of"].dropna()
    best_id = of.iloc[0] if len(of) else run.best_id
    note = (f"Leave-one-out trials of trial {best_id}: each technique turned off in turn, "
            "everything else fixed, repeated. Bars: the best's throughput over the "
            "throughput without it, every measurement of each configuration in the study "
            "pooled (Hodges-Lehmann); whiskers: its 95% interval (docs/measuring.md).")
    if not len(ref):
        best = run.row(run.best_id)
        if best is None or best["status"] != "ok":
            return Effects("ablation", note + " The best configuration itself has no "
                           "measurement to compare against.", [])
        ref = best.to_frame().T
        note += " The best configuration was not re-measured: its one search measurement " \
                "is the reference."
    without = abl[abl["ablation_without"].notna()]
    if not len(without):
        plan = (run.records.get(str(best_id)) or {}).get("plan") or {}
        if not strategies_of(plan):  # the fp32 baseline won (on a CPU it can)
            return Effects("ablation", f"The best configuration (trial {best_id}) uses no "
                           "technique, so there was nothing to turn off: the plain baseline "
                           "was the fastest configuration measured.", [])
        return Effects("ablation", f"No leave-one-out trial of trial {best_id} (each technique "
                       "turned off in turn) was recorded: the study stopped before them.", [])
    records = list(run.records.values())
    pools = pool(records)
    best_pool = pool_of(records, best_id, pools)
    pooled = {t.name: t for t in techniques(records, str(best_id), best_pool, pools)}
    items = []
    for name, grp in without.groupby("ablation_without", sort=True):
        e = Effect(str(name), "ablation", n_reference=len(ref))
        good = grp[grp["status"] == "ok"]
        e.failures = grp[grp["status"] != "ok"]["status"].value_counts().to_dict()
        e.n = len(good)
        if len(good):
            _fill(e, list(ref["samples_per_s"]), list(good["samples_per_s"]),
                  list(ref["peak_memory_bytes"]), list(good["peak_memory_bytes"]))
        t = pooled.get(str(name))
        if t is not None and t.ratio is not None:  # the pooled figures decide
            r = e.ratio = t.ratio
            e.n, e.n_reference = r.n_a if r.method == "paired" else r.n_b, r.n_a
            e.speedup = r.estimate
            e.speedup_lo, e.speedup_hi = (r.lo, r.hi) if r.lo is not None else (
                r.estimate, r.estimate)
            e.clear = None if r.lo is None else r.verdict != SAME
        items.append(e)
    return Effects("ablation", note, items)


def _fill(e: Effect, thr_with, thr_without, mem_with, mem_without) -> None:
    thr_with = [x for x in map(num, thr_with) if x]
    thr_without = [x for x in map(num, thr_without) if x]
    if thr_with and thr_without:
        ratios = [a / b for a in thr_with for b in thr_without]
        e.speedup = median(thr_with) / median(thr_without)
        e.speedup_lo, e.speedup_hi = min(ratios), max(ratios)
        if len(thr_with) > 1 or len(thr_without) > 1:
            e.clear = min(thr_with) > max(thr_without) or max(thr_with) < min(thr_without)
    mem_with = [x for x in map(num, mem_with) if x is not None]
    mem_without = [x for x in map(num, mem_without) if x is not None]
    if mem_with and mem_without:
        diffs = [b - a for a in mem_with for b in mem_without]
        e.memory_saved = median(mem_without) - median(mem_with)
        e.memory_saved_lo, e.memory_saved_hi = min(diffs), max(diffs)


def _key(record: dict, drop: str | None = None) -> str:
    """Everything that defines a configuration, with technique `drop` taken out."""
    plan = record.get("plan") or {}
    strategies = {k: v for k, v in strategies_of(plan).items() if k != drop}
    rest = {k: plan.get(k) for k in ("workload", "workload_args", "layout", "micro_batch_size",
                                     "global_batch_size", "device")}
    return json.dumps([strategies, rest], sort_keys=True, default=str)


def _from_pairs(run: Run) -> list[Effect]:
    t = run.trials
    ok = t[(t["status"] == "ok") & t["samples_per_s"].notna()]
    by_key: dict[str, list[str]] = {}
    for tid in ok.index:
        by_key.setdefault(_key(run.records[tid]), []).append(tid)
    pairs: dict[str, list[tuple[list[str], list[str]]]] = {}
    for ids in by_key.values():
        for name in strategies_of(run.records[ids[0]].get("plan")):
            other = by_key.get(_key(run.records[ids[0]], drop=name))
            if other:
                pairs.setdefault(name, []).append((ids, other))
    items = []
    for name in sorted(pairs):
        e = Effect(name, "pairs", n=len(pairs[name]), n_reference=len(pairs[name]))
        speed, mem = [], []
        for with_ids, without_ids in pairs[name]:
            a, b = ok.loc[with_ids], ok.loc[without_ids]
            speed.append(median(a["samples_per_s"]) / median(b["samples_per_s"]))
            ma, mb = a["peak_memory_bytes"].dropna(), b["peak_memory_bytes"].dropna()
            if len(ma) and len(mb):
                mem.append(median(mb) - median(ma))
        e.speedup, e.speedup_lo, e.speedup_hi = median(speed), min(speed), max(speed)
        if len(speed) > 1:
            e.clear = e.speedup_lo > 1 or e.speedup_hi < 1
        if mem:
            e.memory_saved, e.memory_saved_lo, e.memory_saved_hi = median(mem), min(mem), max(mem)
        items.append(e)
    return items
