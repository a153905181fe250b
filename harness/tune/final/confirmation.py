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

The machine's speed drifts meanwhile (a quickstart's baseline measured 116-198
samples/s in one run), and the search measures each configuration once: one measured
in a fast spell reads faster than a better one measured in a slow spell. So, after
each round asked for, the contenders are chosen anew (at most MAX_CONTENDERS each
round, the baseline besides: a round's size, and the time kept for it, stay bounded)
with each single figure taken against the machine's speed at its moment
(training_harness.records.drift.machine_speed: the configurations measured more than
once, each measurement over its own rounds' median, interpolated in time), and the
band widened to that normalisation's measured error where it exceeds the margin. A
configuration whose figure so corrected could be the best joins the next round; one
that leaves keeps its measurements and stays in the decision. The first round's
contenders, before anything is measured twice, are the single figures' as they are.

The best is the contender with the highest median over every measurement of its
configuration (training_harness.records.pooled: the search's, the rounds', a resumed session's,
the ablation's; a flagged one counts in none). It *leads* a rival when the ratio of the
two, with its interval (training_harness.records.speedup: over the rounds' pairs where there are
enough, else over every measurement), is "faster"; rivals it does not lead are listed as
indistinguishable from it here, and its ratio over the baseline is kept
(`versus_baseline`). Where it does not lead every rival, or the baseline, at this n,
and `more()` says time is left, further rounds (of the best, those it does not lead and
the baseline while that is open) measure windows `longer` times as long, up to
MAX_EXTRA_ROUNDS.

A study of time to a target loss (objective time_to_loss) is ranked by time to target
instead, lowest median first: each round's record is that configuration's steps to
target, taken from the cache (the maths has not changed), times the step time that
round measured. Its spread also covers the seeds' (the fastest and the slowest seed's
steps times each measured step time), so two configurations whose seeds overlap are
not told apart by the step time alone (the rule there stays the spread: the seeds'
spread is not a measurement's noise, and an interval over measurements would miss
it). The decision is kept in the Optuna study's user attribute "best_by_repeats"
(StudyTrials.best_trial reads it) and in study.json.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from training_harness.records.drift import machine_speed
from training_harness.records.pooled import config_key, in_time_order, measurement_of, pool
from training_harness.records.predicates import finished, may_be_best, ranked
from training_harness.records.run_store import RunStore
from training_harness.records.speedup import FASTER, Ratio, ratio
from training_harness.records.tags import tags_of
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock
from training_harness.tune.final.extra_trial import ExtraTrials, attempt_id
from training_harness.tune.study_trials import BEST_BY_REPEATS

MAX_CONTENDERS = 4
MAX_EXTRA_ROUNDS = 6  # rounds beyond those asked for, where the verdict is still open
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
    pairs: list[Hashable | None] = field(default_factory=list)  # each value's round, if any
    windows: list[float] = field(default_factory=list)  # the measured windows, seconds

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
    # throughput: the best over the baseline (training_harness.records.speedup.Ratio, as a dict)
    versus_baseline: dict[str, Any] | None = None
    rounds: int = 0  # the confirmation rounds that measured something
    rounds_unmeasured: int = 0  # rounds whose every trial was skipped for lack of time
    window_s: list[float] | None = None  # the shortest and longest window measured

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def contenders(records: list[dict[str, Any]], margin: float, budget_bytes: float,
               limit: int = MAX_CONTENDERS, by: str = "throughput") -> list[dict[str, Any]]:
    """The search's records that could be the best: within `margin` of the fastest, or
    within a normalised figure's measured uncertainty of it, and the two fastest in any
    case (fastest first, one per configuration, at most `limit`). For throughput each
    configuration's figure is taken against the machine's speed when it was measured
    (drift_free); with no configuration measured twice, that is its single figure."""
    lower = FIGURES[by][1]
    rows = [r for r in ranked(records) if may_be_best(r, budget_bytes)]
    if not rows:
        return []
    score, noise = drift_free(records) if by == "throughput" else (
        lambda r: figure(r, by), 0.0)
    rows.sort(key=score, reverse=not lower)
    # Two trials of one configuration share its pooled figure: one slot, not two.
    once: dict[str, dict[str, Any]] = {}
    for r in rows:
        once.setdefault(config_key(r.get("plan")), r)
    rows = list(once.values())
    top, band = score(rows[0]), min(1 - margin, math.exp(-noise))
    near = (lambda v: v * band <= top) if lower else (lambda v: v >= top * band)
    # The two fastest at least: a lucky measurement far ahead of the rest is checked too.
    return [r for i, r in enumerate(rows) if i < 2 or near(score(r))][:limit]


def drift_free(records: list[dict[str, Any]]
               ) -> tuple[Callable[[dict[str, Any]], float], float]:
    """A record's throughput on the references' footing (the median of its configuration's
    measurements, each over the machine's speed at its moment: training_harness.records.drift),
    and a single figure's uncertainty so normalised, as a log."""
    pools = pool(records)
    speed = machine_speed(pools)

    def score(record: dict[str, Any]) -> float:
        p = pools.get(config_key(record.get("plan")))
        if p is None:
            return figure(record, "throughput")
        return statistics.median(m.value / speed.at(m.at) for m in p.measurements)

    return score, speed.uncertainty()


def standings(records: list[dict[str, Any]], ids: list[str],
              by: str = "throughput") -> dict[str, Standing]:
    """Each trial's measurements: its own (if quiet) and its confirmation rounds'; for
    throughput, every quiet measurement of its configuration (training_harness.records.pooled)."""
    if by == "throughput":
        return _pooled(records, ids)
    out = {i: Standing(i) for i in ids}
    for r in records:
        tags = tags_of(r)
        of = str((tags.get("confirm") or {}).get("of", r["trial_id"]))
        if of not in out or r["status"] != "ok" or not may_be_best(r, 0):
            continue
        if tags.get("phase") == "confirm" or str(r["trial_id"]) == of:
            out[of].values.append(figure(r, by))
            out[of].seeds.extend(seed_times(r))
    return out


def _pooled(records: list[dict[str, Any]], ids: list[str]) -> dict[str, Standing]:
    out = {i: Standing(i) for i in ids}
    keys: dict[str, str] = {}  # configuration -> the contender's id
    for r in records:
        if str(r["trial_id"]) in out:
            keys.setdefault(config_key(r.get("plan")), str(r["trial_id"]))
    for at, r in enumerate(in_time_order(records)):
        m = measurement_of(r, at)
        of = (str((tags_of(r).get("confirm") or {}).get("of", "")) or
              keys.get(config_key(r.get("plan"))))
        if m is not None and of in out:
            out[of].values.append(m.value)
            out[of].pairs.append(m.pair)
            if m.window_s:
                out[of].windows.append(m.window_s)
    return out


def versus(a: Standing, b: Standing) -> Ratio:
    """a over b (throughput), with its interval and verdict."""
    return ratio(a.values, b.values, a.pairs or None, b.pairs or None)


def decide(table: dict[str, Standing], baseline_id: str | None,
           by: str = "throughput", named: str | None = None) -> Decision | None:
    """The best of `table` (or the one `named` already, its figures anew) and whom it
    does not lead."""
    # The baseline is a configuration too: where it leads, it is the best (a study
    # that found nothing faster says so rather than naming a slower configuration).
    rivals = {i: s for i, s in table.items() if s.values}
    if not any(i != baseline_id for i in rivals):
        return None
    sign = -1 if FIGURES[by][1] else 1  # the best has the highest sign x median
    lead = rivals.get(str(named)) or max(rivals.values(), key=lambda s: sign * s.median)

    def within(s: Standing) -> bool:
        if s is lead:
            return True
        if by == "throughput":  # the interval decides (training_harness.records.speedup)
            return versus(lead, s).verdict != FASTER
        return abs(lead.median - s.median) <= max(lead.spread, s.spread)

    close = [i for i, s in rivals.items()
             if i not in (lead.trial_id, baseline_id) and within(s)]
    summary = {i: _summary(s) for i, s in table.items() if s.values}
    base = table.get(baseline_id) if baseline_id is not None else None
    measured_base = base is not None and bool(base.values)
    against = (versus(lead, base).as_dict() if by == "throughput" and measured_base
               and base is not lead else None)
    windows = [w for s in rivals.values() for w in s.windows]
    return Decision(lead.trial_id, lead.median, len(lead.values), sorted(close, key=str),
                    summary, _summary(base) if measured_base else None, baseline_id, by,
                    measured_base and within(base), against,
                    window_s=[min(windows), max(windows)] if windows else None)


def _summary(s: Standing) -> dict[str, Any]:
    out = {"median": s.median, "min": min(s.values), "max": max(s.values), "n": len(s.values)}
    if s.seeds:  # the fastest and slowest seed over every measurement
        out["seeds"] = [min(s.seeds), max(s.seeds)]
    return out


def run_confirmation(study: Study, store: RunStore, budget_bytes: float,
                     optuna_study: optuna.Study, clock: Clock, extra: ExtraTrials,
                     on_event: Callable[[str, dict[str, Any]], None],
                     repeats: int, longer: float, more: Callable[[int], bool]) -> str:
    """Measure the contenders again (`repeats` rounds) and name the best; returns how it
    ended, in words. Rounds beyond budget.confirm_repeats measure windows `longer` times
    each contender's own. Where the verdict is still open after them, further rounds run
    while `more(trials)` says that many more trials fit (at most MAX_EXTRA_ROUNDS)."""
    budget = study.budget
    by = ranked_by(study.objectives)
    if by is None:
        return ("off: the contenders are ranked by throughput or time to target, not "
                f"{study.objective}")
    records = store.records()
    picked = contenders(records, budget.confirm_margin, budget_bytes, by=by)
    if len(picked) < 2 or not repeats:
        return ("off (budget.confirm_repeats = 0)" if not repeats else
                "not needed: fewer than two configurations may be the best")
    baseline = next((r for r in records if tags_of(r).get("phase") == "baseline"
                     and may_be_best(r, budget_bytes)), None)
    ids = [str(r["trial_id"]) for r in picked]
    if baseline is not None and str(baseline["trial_id"]) not in ids:
        picked.append(baseline)
    params = {str(r["trial_id"]): _params_of(optuna_study, r) for r in picked}
    recorded = {str(r["trial_id"]): r for r in records}
    base_id = str(baseline["trial_id"]) if baseline is not None else None
    ended, rnd, measured = "done", 0, 0
    while ended == "done":
        if rnd >= repeats:  # the rounds asked for ran: more only where the verdict is open
            decision = decide(standings(store.records(), list(params), by), base_id, by)
            still = open_question(decision, base_id) if by == "throughput" else []
            if not still or rnd >= repeats + MAX_EXTRA_ROUNDS:
                break
            if not more(len(still)):
                ended = "done; the verdict is still open, and no time is left for more rounds"
                break
            on_event("note", {"text": f"round {rnd + 1}: the confirmation cannot yet "
                                      f"separate trial(s) {', '.join(still)}"})
        elif rnd:  # after a round, the contenders anew: its measurements show the drift
            still, new = _picked_again(store.records(), study, budget_bytes, by,
                                       optuna_study, params, base_id)
            if new:
                on_event("note", {"text": f"round {rnd + 1}: trial(s) {', '.join(new)} join "
                                          "the contenders: against the machine's speed when "
                                          "measured, their figure could be the best"})
        else:
            still = list(params)
        ended, any_measured = _round(clock, extra, {i: params[i] for i in still}, rnd,
                                     recorded, longer if rnd >= budget.confirm_repeats else 1.0)
        rnd += 1
        measured += any_measured
    decision = decide(standings(store.records(), list(params), by), base_id, by)
    if decision is not None:
        decision.rounds, decision.rounds_unmeasured = measured, rnd - measured
        optuna_study.set_user_attr(KEY, decision.as_dict())
    return ended


def _picked_again(records: list[dict[str, Any]], study: Study, budget_bytes: float, by: str,
                  optuna_study: optuna.Study, params: dict[str, dict[str, Any] | None],
                  base_id: str | None) -> tuple[list[str], list[str]]:
    """The ids this round measures (the contenders as the records stand now, and the
    baseline) and those new among them, which join `params` (the decision weighs every
    contender ever picked; one that left keeps its measurements, not measured again)."""
    ids = [str(r["trial_id"]) for r in
           contenders(records, study.budget.confirm_margin, budget_bytes, by=by)]
    new = [i for i in ids if i not in params]
    byid = {str(r["trial_id"]): r for r in records}
    params.update({i: _params_of(optuna_study, byid[i]) for i in new})
    return ids + ([base_id] if base_id is not None and base_id not in ids else []), new


def refreshed(decision: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """A stored throughput decision with every measurement since (the ablation's) pooled
    in: the same best, its figures and ratios anew, so the summary gives one figure per
    configuration. A time-to-target decision is returned as it is."""
    if decision.get("objective", "throughput") != "throughput":
        return decision
    base = decision.get("baseline_id")
    new = decide(standings(records, list(decision["standings"])),
                 None if base is None else str(base), named=str(decision["best"]))
    if new is None:
        return decision
    new.rounds = decision.get("rounds", 0)
    new.rounds_unmeasured = decision.get("rounds_unmeasured", 0)
    return new.as_dict()


def open_question(decision: Decision | None, baseline_id: str | None) -> list[str]:
    """The trial ids a further round should measure: the best, the rivals it does not
    lead, and the baseline where it does not lead that either (none when all is said)."""
    if decision is None:
        return []
    vs = decision.versus_baseline
    base_open = vs is not None and vs["verdict"] != FASTER
    if not decision.indistinguishable and not base_open:
        return []
    ids = [decision.best, *decision.indistinguishable]
    return ids + ([baseline_id] if base_open and baseline_id not in ids else [])


def _round(clock: Clock, extra: ExtraTrials, params: dict[str, dict[str, Any] | None],
           rnd: int, recorded: dict[str, dict[str, Any]], longer: float) -> tuple[str, bool]:
    """One round: each configuration in `params` measured once, in order; how it
    ended, and whether any of its trials measured (one not fitting the time left is
    recorded as skipped, and measures nothing)."""
    measured = False
    for of, p in params.items():
        run_id = attempt_id(recorded, f"confirm-{of}-{rnd}") if p is not None else None
        if run_id is None:
            continue
        if clock.left() <= 0:
            return "time: the deadline came before every round ran", measured
        window = longer * window_s(recorded.get(of)) if longer > 1 else None
        result = extra.run_trial(run_id, p, {"phase": "confirm",
                                             "confirm": {"of": of, "round": rnd}},
                                 window_s=window or None)
        measured = measured or finished(result.to_dict())
    return "done", measured


def window_s(record: dict[str, Any] | None) -> float:
    """The seconds of a record's measured window (0 where it says none)."""
    return float((((record or {}).get("metrics") or {}).get("window") or {}).get("seconds") or 0)


def _params_of(optuna_study: optuna.Study, record: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna parameters of a recorded trial (what the ablation and this re-run)."""
    number = tags_of(record).get("optuna_number")
    if number is None:
        return None
    return dict(optuna_study.trials[number].params)
