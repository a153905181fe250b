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
listed as indistinguishable from it here. The decision is kept in the Optuna
study's user attribute "best_by_repeats" (StudyContext.best_trial reads it) and in
study.json.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from harness.tune.ablation import finished
from harness.tune.sampling import may_be_best
from harness.tune.summary import ranked

if TYPE_CHECKING:
    from harness.tune.context import StudyContext

MAX_CONTENDERS = 4
KEY = "best_by_repeats"


@dataclass
class Standing:
    trial_id: str
    rates: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        return (max(self.rates) - min(self.rates)) / 2


@dataclass
class Decision:
    best: str  # the trial id whose configuration is the best
    median: float
    n: int
    indistinguishable: list[str]  # rivals it does not lead beyond the spread
    standings: dict[str, dict[str, Any]]  # trial id -> median, min, max, n
    baseline: dict[str, Any] | None = None  # the baseline's median, min, max, n
    baseline_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def contenders(records: list[dict[str, Any]], margin: float, budget_bytes: float,
               limit: int = MAX_CONTENDERS) -> list[dict[str, Any]]:
    """The search's records whose throughput is within `margin` of the fastest, and the
    two fastest in any case (fastest first, one per configuration, at most `limit`):
    candidates for the best only."""
    rows = [r for r in ranked(records) if may_be_best(r, budget_bytes)]
    if not rows:
        return []
    top = rows[0]["metrics"]["samples_per_s"]
    # The two fastest at least: a lucky measurement far ahead of the rest is checked too.
    return [r for i, r in enumerate(rows)
            if i < 2 or r["metrics"]["samples_per_s"] >= top * (1 - margin)][:limit]


def standings(records: list[dict[str, Any]], ids: list[str]) -> dict[str, Standing]:
    """Each trial's measurements: its own (if quiet) and its confirmation rounds'."""
    out = {i: Standing(i) for i in ids}
    for r in records:
        tags = r.get("tags") or {}
        of = str((tags.get("confirm") or {}).get("of", r["trial_id"]))
        if of not in out or r["status"] != "ok" or not may_be_best(r, 0):
            continue
        if tags.get("phase") == "confirm" or str(r["trial_id"]) == of:
            out[of].rates.append(r["metrics"]["samples_per_s"])
    return out


def decide(table: dict[str, Standing], baseline_id: str | None) -> Decision | None:
    rivals = {i: s for i, s in table.items() if s.rates and i != baseline_id}
    if not rivals:
        return None
    lead = max(rivals.values(), key=lambda s: s.median)
    close = [i for i, s in rivals.items() if i != lead.trial_id
             and lead.median - s.median <= max(lead.spread, s.spread)]
    summary = {i: _summary(s) for i, s in table.items() if s.rates}
    base = table.get(baseline_id) if baseline_id is not None else None
    return Decision(lead.trial_id, lead.median, len(lead.rates), sorted(close, key=str),
                    summary, _summary(base) if base and base.rates else None, baseline_id)


def _summary(s: Standing) -> dict[str, Any]:
    return {"median": s.median, "min": min(s.rates), "max": max(s.rates), "n": len(s.rates)}


def run_confirmation(ctx: StudyContext) -> str:
    """Measure the contenders again and name the best; returns how it ended, in words."""
    budget = ctx.study.budget
    if "throughput" not in ctx.study.objectives:  # time to a loss has its seeds' spread
        return f"off: the contenders are ranked by throughput, not {ctx.study.objective}"
    records = ctx.run.store.records()
    picked = contenders(records, budget.confirm_margin, ctx.run.budget_bytes)
    if len(picked) < 2 or not budget.confirm_repeats:
        return ("off (budget.confirm_repeats = 0)" if not budget.confirm_repeats else
                "not needed: fewer than two configurations may be the best")
    baseline = next((r for r in records if (r.get("tags") or {}).get("phase") == "baseline"
                     and may_be_best(r, ctx.run.budget_bytes)), None)
    ids = [str(r["trial_id"]) for r in picked]
    if baseline is not None and str(baseline["trial_id"]) not in ids:
        picked.append(baseline)
    params = {str(r["trial_id"]): _params_of(ctx, r) for r in picked}
    recorded = {str(r["trial_id"]): r for r in records}
    ended = "done"
    for rnd in range(budget.confirm_repeats):
        for of, p in params.items():
            trial_id = f"confirm-{of}-{rnd}"
            # on --resume: a round's trial recorded is not run again; one that never
            # finished (the deadline, a worker gone) runs again as <id>-retry<k>
            tries = [i for i in recorded if i == trial_id or i.startswith(f"{trial_id}-retry")]
            if p is None or any(finished(recorded[i]) for i in tries):
                continue
            if ctx.clock.left() <= 0:
                ended = "time: the deadline came before every round ran"
                break
            ctx.run_extra(f"{trial_id}-retry{len(tries)}" if tries else trial_id, p,
                          {"phase": "confirm", "confirm": {"of": of, "round": rnd}})
        if ended != "done":
            break
    base_id = str(baseline["trial_id"]) if baseline is not None else None
    decision = decide(standings(ctx.run.store.records(), list(params)), base_id)
    if decision is not None:
        ctx.optuna_study.set_user_attr(KEY, decision.as_dict())
    return ended


def _params_of(ctx: StudyContext, record: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna parameters of a recorded trial (what the ablation and this re-run)."""
    number = (record.get("tags") or {}).get("optuna_number")
    if number is None:
        return None
    return dict(ctx.optuna_study.trials[number].params)
