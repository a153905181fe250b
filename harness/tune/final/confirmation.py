"""Naming the best from repeats: the contenders measured again, in interleaved rounds.

One measurement's noise on a shared machine (about ±25% on the 2-core CPU) is larger
than the differences between a study's fastest configurations, so the fastest single
measurement is often a lucky one. Before a study names its best, the configurations
whose single measurement lies within `budget.confirm_margin` of the fastest, and the
two fastest in any case (at most MAX_CONTENDERS, fastest first), and the fp32
baseline (the speedup's denominator), are measured again `budget.confirm_repeats`
times, round by round (A, B, C, base; A, B, C, base; ...), so that a slow spell of
the machine falls on all of them. Each record is tagged

    {"phase": "confirm", "confirm": {"of": <trial_id measured again>, "round": r}}

The best is the contender with the highest median over its measurements (the
search's and the rounds'; a flagged one counts in none). It *leads* a rival when the
gap between their medians is larger than the spread of either (half its range of
measurements); when it does not lead every rival, those it does not lead are
listed as indistinguishable from it here.

A study of time to a target loss (objective time_to_loss) is ranked by time to target
instead, lowest median first: each round's record is that configuration's steps to
target, taken from the cache (the maths has not changed), times the step time that
round measured. Its spread also covers the seeds' (the fastest and the slowest seed's
steps times each measured step time), so two configurations whose seeds overlap are
not told apart by the step time alone. The decision is kept in the Optuna
study's user attribute "best_by_repeats" (TunerState.best_trial reads it) and in
study.json.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.records.predicates import may_be_best, ranked
from harness.records.tags import tags_of
from harness.tune.final.extra_trial import attempt_id, run_extra
from harness.tune.tuner_state import BEST_BY_REPEATS, TunerState

MAX_CONTENDERS = 4
KEY = BEST_BY_REPEATS
# what the rounds compare, by objective: the record's figure, and whether lower is better
FIGURES = {"throughput": ("samples_per_s", False), "time_to_loss": ("time_to_target_s", True)}


def ranked_by(objectives: list[str]) -> str | None:
    """The objective the rounds rank by (throughput first), or None: nothing to rank."""
    return next((o for o in FIGURES if o in objectives), None)


def figure(record: dict[str, Any], by: str) -> float:
    return record["metrics"][FIGURES[by][0]]


def seed_times(record: dict[str, Any]) -> list[float]:
    """A time-to-target record's fastest and slowest seed, at this record's step time."""
    spread = (record["metrics"].get("convergence") or {}).get("time_spread_s")
    return list(spread) if spread else []


@dataclass
class Standing:
    trial_id: str
    values: list[float] = field(default_factory=list)  # one per measurement
    seeds: list[float] = field(default_factory=list)  # time to target: each one's seeds'

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        every = self.values + self.seeds
        return (max(every) - min(every)) / 2


@dataclass
class Decision:
    best: str  # the trial id whose configuration is the best
    median: float
    n: int
    indistinguishable: list[str]  # rivals it does not lead beyond the spread
    standings: dict[str, dict[str, Any]]  # trial id -> median, min, max, n (seeds)
    baseline: dict[str, Any] | None = None  # the baseline's median, min, max, n
    baseline_id: str | None = None
    objective: str = "throughput"  # or "time_to_loss": the medians are seconds to target
    baseline_within_spread: bool = False  # the best does not lead the baseline beyond it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def contenders(records: list[dict[str, Any]], margin: float, budget_bytes: float,
               limit: int = MAX_CONTENDERS, by: str = "throughput") -> list[dict[str, Any]]:
    """The search's records whose throughput (or 1 / time to target) is within `margin`
    of the fastest, and the two fastest in any case (fastest first, one per
    configuration, at most `limit`): candidates for the best only."""
    lower = FIGURES[by][1]
    rows = sorted((r for r in ranked(records) if may_be_best(r, budget_bytes)),
                  key=lambda r: figure(r, by), reverse=not lower)
    if not rows:
        return []
    top = figure(rows[0], by)
    near = ((lambda v: v * (1 - margin) <= top) if lower else
            (lambda v: v >= top * (1 - margin)))
    # The two fastest at least: a lucky measurement far ahead of the rest is checked too.
    return [r for i, r in enumerate(rows) if i < 2 or near(figure(r, by))][:limit]


def standings(records: list[dict[str, Any]], ids: list[str],
              by: str = "throughput") -> dict[str, Standing]:
    """Each trial's measurements: its own (if quiet) and its confirmation rounds'."""
    out = {i: Standing(i) for i in ids}
    for r in records:
        tags = tags_of(r)
        of = str((tags.get("confirm") or {}).get("of", r["trial_id"]))
        if of not in out or r["status"] != "ok" or not may_be_best(r, 0):
            continue
        if tags.get("phase") == "confirm" or str(r["trial_id"]) == of:
            out[of].values.append(figure(r, by))
            if by == "time_to_loss":
                out[of].seeds.extend(seed_times(r))
    return out


def decide(table: dict[str, Standing], baseline_id: str | None,
           by: str = "throughput") -> Decision | None:
    # The baseline is a configuration too: where it leads, it is the best (a study
    # that found nothing faster says so rather than naming a slower configuration).
    rivals = {i: s for i, s in table.items() if s.values}
    if not any(i != baseline_id for i in rivals):
        return None
    sign = -1 if FIGURES[by][1] else 1  # the best has the highest sign x median
    lead = max(rivals.values(), key=lambda s: sign * s.median)

    def within(s: Standing) -> bool:
        return abs(lead.median - s.median) <= max(lead.spread, s.spread)

    close = [i for i, s in rivals.items()
             if i not in (lead.trial_id, baseline_id) and within(s)]
    summary = {i: _summary(s) for i, s in table.items() if s.values}
    base = table.get(baseline_id) if baseline_id is not None else None
    measured_base = base is not None and bool(base.values)
    return Decision(lead.trial_id, lead.median, len(lead.values), sorted(close, key=str),
                    summary, _summary(base) if measured_base else None, baseline_id, by,
                    measured_base and within(base))


def _summary(s: Standing) -> dict[str, Any]:
    out = {"median": s.median, "min": min(s.values), "max": max(s.values), "n": len(s.values)}
    if s.seeds:  # the fastest and slowest seed over every measurement
        out["seeds"] = [min(s.seeds), max(s.seeds)]
    return out


def run_confirmation(ctx: TunerState, repeats: int | None = None, longer: float = 1.0) -> str:
    """Measure the contenders again (`repeats` rounds; budget.confirm_repeats by default)
    and name the best; returns how it ended, in words. Rounds beyond
    budget.confirm_repeats measure windows `longer` times each contender's own."""
    budget = ctx.study.budget
    repeats = budget.confirm_repeats if repeats is None else repeats
    by = ranked_by(ctx.study.objectives)
    if by is None:
        return ("off: the contenders are ranked by throughput or time to target, not "
                f"{ctx.study.objective}")
    records = ctx.run.store.records()
    picked = contenders(records, budget.confirm_margin, ctx.run.budget_bytes, by=by)
    if len(picked) < 2 or not repeats:
        return ("off (budget.confirm_repeats = 0)" if not repeats else
                "not needed: fewer than two configurations may be the best")
    baseline = next((r for r in records if tags_of(r).get("phase") == "baseline"
                     and may_be_best(r, ctx.run.budget_bytes)), None)
    ids = [str(r["trial_id"]) for r in picked]
    if baseline is not None and str(baseline["trial_id"]) not in ids:
        picked.append(baseline)
    params = {str(r["trial_id"]): _params_of(ctx, r) for r in picked}
    recorded = {str(r["trial_id"]): r for r in records}
    ended = "done"
    for rnd in range(repeats):
        for of, p in params.items():
            trial_id = f"confirm-{of}-{rnd}"
            run_id = attempt_id(recorded, trial_id) if p is not None else None
            if run_id is None:
                continue
            if ctx.clock.left() <= 0:
                ended = "time: the deadline came before every round ran"
                break
            window = None
            if rnd >= budget.confirm_repeats and longer > 1:
                window = longer * window_s(recorded.get(of))
            run_extra(ctx, run_id, p, {"phase": "confirm", "confirm": {"of": of, "round": rnd}},
                      window_s=window or None)
        if ended != "done":
            break
    base_id = str(baseline["trial_id"]) if baseline is not None else None
    decision = decide(standings(ctx.run.store.records(), list(params), by), base_id, by)
    if decision is not None:
        ctx.optuna_study.set_user_attr(KEY, decision.as_dict())
    return ended


def window_s(record: dict[str, Any] | None) -> float:
    """The seconds of a record's measured window (0 where it says none)."""
    return float((((record or {}).get("metrics") or {}).get("window") or {}).get("seconds") or 0)


def _params_of(ctx: TunerState, record: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna parameters of a recorded trial (what the ablation and this re-run)."""
    number = tags_of(record).get("optuna_number")
    if number is None:
        return None
    return dict(ctx.optuna_study.trials[number].params)
