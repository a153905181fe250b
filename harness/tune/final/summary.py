"""The end of a study: the ranked table, the ablation's spread, best.toml, study.json."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from training_harness.core.plan import Plan
from training_harness.core.units import format_bytes, format_rate, format_seconds
from training_harness.records.plan_text import describe_plan, varying
from training_harness.records.pooled import Pooled, compare, config_key, pool, pool_of
from training_harness.records.predicates import busy_note, may_be_best, ranked
from training_harness.records.run_store import RunStore, write_atomic
from training_harness.records.speedup import NOISE_THRESHOLD, Ratio
from training_harness.records.tags import VARIANT, tags_of
from training_harness.records.verdict import StudyVerdict, techniques
from training_harness.tune.final.ablation import ablation_rows


def _to_target(m: dict[str, Any]) -> str:
    """' | batch 64 adamw, to target 8.4 s (176 steps)' for a record trained to a loss."""
    conv = m.get("convergence")
    if not conv:
        return ""
    return (f" | batch {conv['global_batch']} {conv['optimizer']}, to target "
            f"{format_seconds(conv['time_to_target_s'])} ({conv['steps_to_target']:g} steps)")


def pareto(rows: list[dict[str, Any]]) -> set[Any]:
    """Trial ids on the throughput / peak memory front."""
    def point(r):
        return r["metrics"].get("samples_per_s") or 0, r["metrics"].get("peak_memory_bytes") or 0
    front = set()
    for r in rows:
        t, m = point(r)
        if not any((t2 >= t and m2 <= m) and (t2 > t or m2 < m) for t2, m2 in map(point, rows)):
            front.add(r["trial_id"])
    return front


def table(records: list[dict[str, Any]], multi: bool, top: int = 10,
          memory_budget: float | None = None, best_id: Any = None) -> str:
    """The measured configurations, fastest first, each by its one figure: the median
    of every quiet measurement of it, in any phase (training_harness.records.pooled), and their
    n; `!` marks one whose peak was over `memory_budget`, `~` one measured while the
    machine was busy (they ran, but are never the best). Where a configuration the
    confirmation did not weigh ranks above the named best `best_id` (the ablation
    measured it again, say), a line says so and how the two compare."""
    rows = ranked(records)
    pools = pool(records)

    def pooled(r: dict[str, Any]) -> Pooled | None:
        return pools.get(config_key(r.get("plan")))

    by_pool = not any(r["metrics"].get("time_to_target_s") for r in rows)
    once: set[Any] = set()  # measured once where the best was confirmed: listed apart
    if by_pool:  # throughput: by pool
        rows.sort(key=lambda r: -(p.median if (p := pooled(r)) else
                                  r["metrics"].get("samples_per_s") or 0))
        best = next((r for r in rows if str(r["trial_id"]) == str(best_id)), None)
        if best is not None and (pooled(best).n if pooled(best) else 1) > 1:
            once = {r["trial_id"] for r in rows if r is not best
                    and (pooled(r).n if pooled(r) else 1) == 1}
            rows.sort(key=lambda r: r["trial_id"] in once)  # stable: each group by median
    front = pareto(rows) if multi else set()
    busy = {r["trial_id"] for r in rows if busy_note(r)}
    over = {r["trial_id"] for r in rows if not may_be_best(r, memory_budget)} - busy
    lines = [f"{'#':>3}  {'trial':>8}  {'phase':<10} {'samples/s':>12} {'n':>3} {'step':>10} "
             f"{'peak mem':>11} {'predicted':>11}  configuration"]
    differ = varying([r["plan"] for r in rows[:top]])  # what tells the rows shown apart
    for i, r in enumerate(rows[:top], start=1):
        if r["trial_id"] in once and (i == 1 or rows[i - 2]["trial_id"] not in once):
            lines.append("  measured once (one figure each, never ranked above the best "
                         "named from repeats; a longer --budget measures them again):")
        m, p = r["metrics"], r.get("predicted") or {}
        mark = ("!" if r["trial_id"] in over else "~" if r["trial_id"] in busy
                else "*" if r["trial_id"] in front else " ")
        figure = pooled(r)
        lines.append(
            f"{i:>3}{mark} {r['trial_id']!s:>8}  {r['tags'].get('phase', ''):<10} "
            f"{format_rate(figure.median if figure else m.get('samples_per_s'), ''):>12} "
            f"{figure.n if figure else 1:>3} "
            f"{format_seconds((m.get('step_time_s') or {}).get('median')):>10} "
            f"{format_bytes(m.get('peak_memory_bytes')):>11} "
            f"{format_bytes(p.get('calibrated_peak_memory_bytes')):>11}  "
            f"{describe_plan(r['plan'], differ)}{_to_target(m)}")
    if rows:
        lines.append("  samples/s: the median of every quiet measurement of the configuration "
                     "(search, rounds, ablation, variants), n of them")
    if by_pool:
        lines += _above_the_best(rows, pooled, best_id, busy | over)
    if multi:
        lines.append("  * on the Pareto front of throughput and peak memory")
    if over & {r["trial_id"] for r in rows[:top]}:
        lines.append(f"  ! its peak memory was over the budget, {format_bytes(memory_budget)}: "
                     "not a candidate for the best")
    return "\n".join(lines)


def _above_the_best(rows: list[dict[str, Any]], pooled: Callable[[dict], Pooled | None],
                    best_id: Any, excluded: set[Any]) -> list[str]:
    best = next((r for r in rows if str(r["trial_id"]) == str(best_id)), None)
    top = next((r for r in rows if r["trial_id"] not in excluded), None)
    if best is None or top is None or top is best:
        return []
    mine, theirs = pooled(best), pooled(top)
    if mine is None or theirs is None or theirs.median <= mine.median:
        return []
    r = compare(theirs, mine)
    return [f"  trial {top['trial_id']} ranks above the best named, trial {best_id}, on "
            f"measurements the confirmation did not weigh (the ablation's, say); its "
            f"figure over the best's: {r.text()}"]


def status_counts(records: list[dict[str, Any]]) -> str:
    counts = Counter(r["status"] for r in records)
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def ablation_table(records: list[dict[str, Any]], of: Any) -> str:
    """The ablation of trial `of`: each configuration's pooled figure, and what each
    technique bought (the best over the configuration without it, with its interval)."""
    rows = ablation_rows(records, of)
    if not rows:
        return ""
    pools = pool(records)
    best = pool_of(records, of, pools)
    effects = {t.name: t for t in techniques(records, str(of), best, pools)}
    lines = [f"ablation of trial {of} (samples/s, every measurement of each configuration "
             "pooled: median [min, max], n; what a technique bought: the best over the "
             "configuration without it)"]
    if best is not None:
        lines.append(f"  {'the best itself':<24} {_figure(best)}")
    for row in rows:
        if row["without"] is None:
            continue
        name = f"without {row['without']}"
        t = effects.get(str(row["without"]))
        if t is None or t.without is None:
            lines.append(f"  {name:<24} {', '.join(row['statuses'])}: needed, the "
                         "configuration did not run without it")
            continue
        bought = f"  {row['without']}: {t.ratio.text()}" if t.ratio else ""
        lines.append(f"  {name:<24} {_figure(t.without)}{bought}")
    return "\n".join(lines)


def _figure(p: Pooled) -> str:
    return f"{p.median:.4g} [{p.lo:.4g}, {p.hi:.4g}], n={p.n}"


def verdict_text(v: StudyVerdict) -> str:
    """The study's verdict (training_harness.records.verdict), its headline first: what the best
    is worth against the baseline, what that rests on, and drift where there was some."""
    head = v.headline()
    if not head:
        return ""
    lines = [head]
    if v.best is not None and v.baseline is not None and not v.same_configuration:
        lines.append(f"  best, trial {v.best_id}: {v.best.text()}; strict fp32 baseline, "
                     f"trial {v.baseline_id}: {v.baseline.text()} (every quiet measurement "
                     "of each configuration, any phase)")
    r = v.versus_baseline
    if r is not None:
        windows = [w for p in (v.best, v.baseline) if p and p.windows for w in p.windows]
        span = (f", windows of {min(windows):.3g}-{max(windows):.3g} s" if windows else "")
        lines.append(f"  the verdict rests on {r.basis}{span}; {r.method_text}, "
                     f"noise threshold {NOISE_THRESHOLD:.0%} (docs/measuring.md)")
    if v.drift is not None and v.drift.named:
        lines.append("  " + v.drift.text())
    return "\n".join(lines)


def variants_table(records: list[dict[str, Any]], best_rate: float | None) -> str:
    """The best's variants (training_harness.tune.final.variants): each one's samples/s against the
    best's pooled figure, with its interval, and the settings worth adding to the space."""
    from training_harness.tune.final.variants import variant_rows

    of = next((str(tags_of(r)["variant"]["of"]) for r in records
               if tags_of(r).get("phase") == VARIANT), None)
    if of is None:
        return ""
    pools = pool(records)
    by_id = {str(r.get("trial_id")): r for r in records}
    best = pools.get(config_key(by_id[of].get("plan"))) if of in by_id else None
    lines = [f"variants of trial {of}, settings the search left out (measured once each; "
             "against the best's pooled figure):"]
    faster = []
    for row in variant_rows(records, of):
        rate = row["samples_per_s"]
        mine = pools.get(config_key(by_id[str(row["trial_id"])].get("plan")))
        if row["status"] == "ok" and rate and mine is not None and best is not None:
            r = compare(mine, best)
            lines.append(f"  {row['change']:<40} {mine.median:.4g} samples/s, {r.text()}")
            if mine.median > best.median:
                faster.append(row["change"])
        elif row["status"] == "ok" and rate and best_rate:
            lines.append(f"  {row['change']:<40} {rate:.4g} samples/s, "
                         f"{rate / best_rate:.2f}x the best (one measurement)")
            if rate > best_rate:
                faster.append(row["change"])
        else:
            reason = (row.get("reason") or "").split("\n")[0]
            lines.append(f"  {row['change']:<40} {row['status']}" + (f": {reason}" if reason
                                                                     else ""))
    if faster:
        lines.append(f"  faster than the best: {', '.join(faster)}; add them to the study's "
                     "space and confirm them with repeats before trusting one measurement")
    return "\n".join(lines)


def confirmation_text(decision: dict[str, Any]) -> str:
    """The confirmation rounds' verdict (training_harness.tune.final.confirmation.Decision,
    as stored)."""
    timed = decision.get("objective") == "time_to_loss"  # seconds to target, lower is better
    unit = "s to target" if timed else "samples/s"
    again = any(s["n"] > 1 for s in decision["standings"].values())
    lines = [("the contenders measured again" if again else
              "the contenders (no round ran before the deadline: one measurement each)")
             + f" ({unit}: median [min, max], n" + (", [fastest, slowest seed]):" if timed
                                                   else "):")]
    for trial_id, s in sorted(decision["standings"].items(),
                              key=lambda kv: kv[1]["median"] * (1 if timed else -1)):
        is_base = str(trial_id) == str(decision.get("baseline_id"))
        mark = ("best, the strict fp32 baseline" if is_base and str(trial_id) == str(
            decision["best"]) else "best" if str(trial_id) == str(decision["best"]) else
                "strict fp32 baseline" if is_base else "")
        seeds = f", [{s['seeds'][0]:.4g}, {s['seeds'][1]:.4g}]" if s.get("seeds") else ""
        lines.append(f"  trial {trial_id!s:<8} {s['median']:.4g} [{s['min']:.4g}, "
                     f"{s['max']:.4g}], n={s['n']}{seeds}  {mark}".rstrip())
    base = decision.get("baseline")
    ratio = base and base["median"] and (base["median"] / decision["median"] if timed
                                         else decision["median"] / base["median"])
    speed = (f", {ratio:.2f}x {'as fast to the target as ' if timed else ''}the strict fp32 "
             "baseline's median (TF32 off)" if ratio else "")
    vs = decision.get("versus_baseline")
    if vs:  # throughput: the interval and the verdict (training_harness.records.speedup)
        r = Ratio(**vs)
        speed = (f", {r.estimate:.2f}x the strict fp32 baseline (TF32 off; {r.interval}, "
                 f"{r.basis}): {r.said}")
    if str(decision["best"]) == str(decision.get("baseline_id")):
        speed = (": the strict fp32 baseline itself; no configuration measured was "
                 f"{'sooner to the target' if timed else 'faster'}")
    elif ratio and decision.get("baseline_within_spread") and not vs:
        speed += (f" (within the spread of the measurements{' and seeds' if timed else ''}: "
                  "a lead this machine did not show beyond its noise)")
    lines.append(f"best: trial {decision['best']}, {decision['median']:.4g} {unit} median "
                 f"over {decision['n']} measurements{speed}")
    # The figures are refreshed after the ablation measured the best again (refreshed):
    # a contender can then lead on medians that the rounds did not weigh.
    extreme, leader = ("lowest", min) if timed else ("highest", max)
    top = leader(decision["standings"].items(), key=lambda kv: kv[1]["median"])[0]
    moved = str(top) != str(decision["best"]) and str(top) != str(decision.get("baseline_id"))
    if moved:
        lines.append(f"  trial {top} has the {extreme} median now, "
                     "with the measurements taken after the rounds named the best (the "
                     "ablation's); best.toml keeps the best the rounds named")
    close = ", ".join(map(str, decision["indistinguishable"]))
    rule = ("the medians' gap is within the spread of the measurements and seeds" if timed
            else "its ratio over each is not distinguishable at this n" if vs or not base
            else "the medians' gap is within the spread of the measurements")
    if close:
        lines.append(f"  indistinguishable from it here ({rule}): trial(s) {close}"
                     + ("" if moved else f"; best.toml names the {extreme} median of the "
                                          "contenders"))
    if decision.get("rounds"):
        window = decision.get("window_s")
        span = f", windows of {window[0]:.3g}-{window[1]:.3g} s" if window else ""
        lines.append(f"  {decision['rounds']} confirmation round(s){span}")
    if decision.get("rounds_unmeasured"):
        lines.append(f"  {decision['rounds_unmeasured']} confirmation round(s) measured "
                     "nothing: their trials did not fit the time left (a longer --budget "
                     "measures the contenders again)")
    return "\n".join(lines)


def tf32_reference(records: list[dict[str, Any]], baseline: dict[str, Any] | None
                   ) -> dict[str, Any] | None:
    """The measured fp32+TF32 trial: the baseline's configuration (its strategies, layout
    and micro-batch) with [strategies.tf32] added, finished; None when the study has none."""
    if not baseline:
        return None
    plan = baseline.get("plan") or {}
    want = set(plan.get("strategies") or {}) | {"tf32"}
    for r in records:
        p = r.get("plan") or {}
        if (r.get("status") == "ok" and set(p.get("strategies") or {}) == want
                and p.get("layout") == plan.get("layout")
                and p.get("micro_batch_size") == plan.get("micro_batch_size")
                and (r.get("metrics") or {}).get("samples_per_s")):
            return r
    return None


def tf32_line(records: list[dict[str, Any]], baseline: dict[str, Any] | None,
              best_rate: float | None, best: Pooled | None = None) -> str:
    """The best's speedup over fp32+TF32 where such a trial was measured, else "": over
    the pooled figures with its interval where `best` (the best's pool) is given."""
    ref = tf32_reference(records, baseline)
    if ref is None or not best_rate:
        return ""
    ref_rate = ref["metrics"]["samples_per_s"]
    mine = pool(records).get(config_key(ref.get("plan")))
    if best is not None and mine is not None:
        r = compare(best, mine)
        return (f"  {r.estimate:.2f}x fp32+TF32 (trial {ref['trial_id']}, {mine.text()}; "
                f"{r.interval}, {r.basis}): {r.said}")
    return (f"  {best_rate / ref_rate:.2f}x fp32+TF32 (trial {ref['trial_id']}, "
            f"{ref_rate:.4g} samples/s; one measurement)")


def write_best(store: RunStore, study_name: str, trial_id: Any, plan: dict[str, Any],
               rate: float | None, figure: Pooled | None = None, against: str = "") -> None:
    """best.toml, its comment naming the best's figure: `figure` (every measurement of its
    configuration, pooled) where given, and `against`, its ratio over the baseline."""
    best = Plan.from_dict(plan).replace(name=f"{study_name}-best")
    said = (f", {figure.text()} (every quiet measurement of this configuration, pooled)"
            if figure is not None else f", {format_rate(rate, 'samples/s')}" if rate else "")
    head = (f"# The best configuration of study {study_name}: trial {trial_id}{said}.\n"
            + (f"# Against the strict fp32 baseline: {against}\n" if against else "")
            + f"# Re-run it: harness bench {store.best_toml}\n")
    write_atomic(store.best_toml, head + best.to_toml())


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
