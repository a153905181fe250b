"""`harness report RUN_DIR`: one HTML page per study, built from its stored records."""

from __future__ import annotations

import re

from training_harness.core.units import format_bytes, format_seconds
from training_harness.records.speedup import NOISE_THRESHOLD
from training_harness.reports import figures_convergence as fc
from training_harness.reports import figures_perf as perf
from training_harness.reports import figures_prediction as fp
from training_harness.reports import figures_study as fs
from training_harness.reports.effects import technique_effects
from training_harness.reports.environment import environment_rows
from training_harness.reports.export import trial_table
from training_harness.reports.headline import Headline, headline
from training_harness.reports.html import (
    card,
    e,
    figure,
    kv_table,
    page,
    section,
    sortable_table,
    status,
)
from training_harness.reports.importance import param_importances
from training_harness.reports.load import Run
from training_harness.reports.style import num, pct, rate


def build_report(run: Run) -> str:
    h = headline(run)
    effects = technique_effects(run)
    importances, imp_note = param_importances(run)
    figures = [fs.effects_figure(effects), perf.throughput_memory(run), perf.micro_batch(run),
               fs.history(run), fs.importances_figure(importances, imp_note),
               perf.step_times(run), perf.loss_curves(run), fp.memory_prediction(run),
               fp.step_time_prediction(run)]
    body = [headline_html(run, h), figure(figures[0], effects_table(effects))]
    body += [figure(f) for f in figures[1:]]
    ttl = fc.points(run)
    if ttl:  # trained to a target loss: the curves and MLPerf's convergence points
        body += [figure(fc.loss_vs_time(run)), figure(fc.loss_vs_samples(run)),
                 section("ttl_table", "Steps to target by global batch and technique",
                         fc.steps_table(run), "The fastest configuration of each pair: median "
                         "over seeds, [fastest–slowest seed]; time = steps × its step time.")]
    body += [trials_html(run), failures_html(run), study_html(run),
             section("env", "Environment", environment_rows(run))]
    if run.notes:
        body.append(section("notes", "Notes on the records",
                            "<ul>" + "".join(f"<li>{e(n)}</li>" for n in run.notes) + "</ul>"))
    nav = [("headline", "Headline"), ("effects", "Techniques"), ("pareto", "Throughput × memory"),
           ("mbs", "Micro-batch"), ("history", "History"), ("importances", "Importances"),
           ("steps", "Step times"), ("loss", "Loss"), ("memory", "Estimator"),
           ("steptime", "Step-time model"),
           ("trials", "All trials"), ("failures", "Failures"), ("study", "Study"),
           ("env", "Environment")]
    if ttl:
        nav[-4:-4] = [("ttl_time", "Loss × time"), ("ttl_samples", "Loss × samples"),
                      ("ttl_table", "Steps to target")]
    n = len(run.trials)
    sub = (f"{'study' if run.kind == 'study' else 'bench run'} · {n} trial{'s' * (n != 1)} · "
           f"{run.path}")
    return page(f"Report: {run.name}", sub, nav, "".join(body))


def _time_to_target_card(run: Run) -> str:
    """First in the headline when configurations were trained to a target loss."""
    best, note = fc.fastest(run)
    if best is None:
        return card("time to target", "not reached", note, "bad")
    target = best.conv.get("target_loss")
    return card(f"time to validation loss {target:g}", format_seconds(best.time_s),
                f"{fc.tid(best.trial_id)} {best.technique}, global batch {best.batch}, "
                f"{best.steps:g} steps; {note}".rstrip("; "), "good")


def headline_html(run: Run, h: Headline) -> str:
    b, base = h.best, h.baseline
    parts = [f'<p class="verdict">{e(h.verdict)}</p>']
    if h.study is not None and h.study.drift is not None and h.study.drift.named:
        parts.append(f'<p class="note bad">{e(h.study.drift.text())}.</p>')
    if h.speedup is None:
        parts += [f'<p class="note">{e(m)}</p>' for m in h.missing]
    cards = [_time_to_target_card(run)] if fc.points(run) else []
    if h.speedup is not None:
        cards.append(card("speedup over fp32", f"{h.speedup:.2f}×",
                          f"{rate(b['samples_per_s'])} vs {rate(base['samples_per_s'])} samples/s"
                          if h.basis == "one measurement each" else h.basis,
                          "good" if h.speedup >= 1 else "bad"))
    if b is not None:
        tok = f", {rate(b['tokens_per_s'])} tokens/s" if num(b["tokens_per_s"]) else ""
        pooled = getattr(h.study, "best", None)
        best_rate = pooled.median if pooled else b["samples_per_s"]
        cards.append(card("best throughput", f"{rate(best_rate)} samples/s",
                          f"trial {b['trial_id']}{tok}" + (
                              f"; median of {pooled.n} measurements" if pooled else "")))
        mem = format_bytes(num(b["peak_memory_bytes"]))
        detail = (f"{h.memory_ratio:.2f}× the baseline's "
                  f"{format_bytes(num(base['peak_memory_bytes']))}" if h.memory_ratio else "")
        cards.append(card("peak memory", mem, detail))
        mfu = pct(b["mfu"])
        bmfu = "" if base is None or num(base["mfu"]) is None else f"baseline {pct(base['mfu'])}"
        cards.append(card("MFU", mfu, bmfu))
        p10, p90 = format_seconds(num(b["step_time_p10"])), format_seconds(num(b["step_time_p90"]))
        cards.append(card("step time (median)", format_seconds(num(b["step_time_median"])),
                          f"p10 {p10}, p90 {p90}, n={_n(b['step_n'], '{:g}')}"))
    parts.append(f'<div class="cards">{"".join(cards)}</div>')
    if b is not None:
        rows = [("configuration", b["config"]), ("layout (data × pipeline × tensor)", b["layout"]),
                ("micro-batch / global batch", f"{b['micro_batch_size']:g} / "
                                               f"{b['global_batch_size']:g}"),
                ("workload", f"{b['workload']} {b['workload_args']}"),
                ("why this one", run.best_note)]
        rows += _pooled_rows(h)
        if base is not None:
            rows.append(("baseline", f"trial {base['trial_id']} ({run.baseline_note}): "
                                     f"{base['config']}, {base['status']}"))
        parts.append(kv_table(rows))
        parts.append('<p class="note">Reproduce the best configuration:</p>')
        parts.append(f"<pre>{e(h.command or 'no command recorded')}</pre>")
        if h.best_toml_command:
            parts.append(f"<pre>{e(h.best_toml_command)}</pre>")
    return section("headline", "Headline: the best configuration against the fp32 baseline",
                   "".join(parts))


def _pooled_rows(h: Headline) -> list[tuple[str, str]]:
    """The figures the headline's verdict rests on, and how it is made."""
    v = h.study
    if v is None:
        return []
    rows = []
    for name, p in (("best, every measurement pooled", v.best),
                    ("baseline, every measurement pooled", v.baseline)):
        if p is not None:
            phases = ", ".join(f"{k} {n}" for k, n in p.phases.items())
            window = (f"; windows {p.windows[0]:.3g}–{p.windows[1]:.3g} s" if p.windows
                      else "")
            rows.append((name, f"{p.text()} ({phases}{window})"))
    r = v.versus_baseline
    if r is not None:
        rows.append(("how the verdict is made", f"{r.method_text}, over {r.basis}; "
                     f"{NOISE_THRESHOLD:.0%} noise threshold (docs/measuring.md)"))
    return rows


def effects_table(effects) -> str:
    if not effects.items:
        return ""
    rows = "".join(
        f"<tr><td>{e(x.technique)}</td><td>{e(x.verdict)}</td>"
        f'<td class="n">{_range(x.speedup, x.speedup_lo, x.speedup_hi, "×")}</td>'
        f'<td class="n">{_bytes_range(x)}</td>'
        f'<td class="n">{x.n} of {x.n + sum(x.failures.values())}</td></tr>'
        for x in effects.items)
    return ("<table><thead><tr><th>technique</th><th>what it bought</th>"
            "<th>throughput × (range)</th><th>memory saved (range)</th>"
            f"<th>finished without it</th></tr></thead><tbody>{rows}</tbody></table>")


def _range(v, lo, hi, unit) -> str:
    return "–" if v is None else e(f"{v:.3f}{unit} ({lo:.3f}–{hi:.3f})")


def _bytes_range(x) -> str:
    if x.memory_saved is None:
        return "–"
    return e(f"{format_bytes(x.memory_saved)} ({format_bytes(x.memory_saved_lo)} – "
             f"{format_bytes(x.memory_saved_hi)})")


def trials_html(run: Run) -> str:
    t = trial_table(run)
    cols = [("trial", "text"), ("phase", "text"), ("status", "text"), ("configuration", "wide"),
            ("layout", "text"), ("micro-batch", "num"), ("samples/s", "num"),
            ("configuration: median, n", "num"), ("× baseline", "num"),
            ("step time (p10–p90)", "num"), ("MFU", "num"), ("peak memory", "num"),
            ("duration", "num"), ("reason", "long")]
    on_nodes = bool(t["nodes"].astype(bool).any())  # trials run as Slurm jobs: their nodes
    if on_nodes:
        cols.insert(5, ("nodes", "text"))
    rows = []
    for r in t.itertuples():
        cls = "best" if r.is_best else ("baseline" if r.is_baseline else "")
        reason = str(r.reason or "")
        first = reason.split("\n", 1)[0]
        rows.append((cls, [
            (e(r.trial_id), r.trial_id), (e(r.phase), r.phase),
            (status(r.status) + (f' <i title="{e(r.busy)}">busy</i>' if r.busy else "")
             + (f' <i title="{e(r.host_bound)}">host-bound</i>' if r.host_bound else ""),
             r.status),
            (f'<span title="{e(r.config)}">{e(r.label)}</span>'
             + (f" <i>(without {e(r.ablation_without)})</i>"
                            if isinstance(r.ablation_without, str) else "")
             + (f" <i>(measured in trial {e(r.duplicate_of)})</i>"
                if isinstance(r.duplicate_of, str) else ""), r.label),
            (e(r.layout), r.layout), (_n(r.micro_batch_size, "{:g}"), r.micro_batch_size),
            (e(rate(r.samples_per_s)), r.samples_per_s),
            (e(f"{rate(r.config_median_samples_per_s)}, n={r.config_n}") if r.config_n else "–",
             r.config_median_samples_per_s),
            (_n(r.speedup_vs_baseline, "{:.2f}×"), r.speedup_vs_baseline),
            (_step(r.step_time_median_s, r.step_time_p10_s, r.step_time_p90_s),
             r.step_time_median_s),
            (e(pct(r.mfu)), r.mfu),
            (f'<span title="predicted {e(format_bytes(num(r.predicted_memory_bytes)))}">'
             f"{e(_bytes(r.peak_memory_bytes))}</span>", r.peak_memory_bytes),
            (e(format_seconds(num(r.duration_s)) if num(r.duration_s) else "–"), r.duration_s),
            (f'<span title="{e(reason)}">{e(first[:140])}</span>', first)]))
        if on_nodes:
            rows[-1][1].insert(5, (e(r.nodes or "–"), r.nodes))
    return section("trials", "All trials", sortable_table("trial-table", cols, rows),
                   "Click a column to sort; type to filter. The best trial is yellow, the "
                   "baseline grey. 'busy': measured while other processes used the "
                   "machine (hover for how much); such a figure is never the best. "
                   "'host-bound': the GPU ran kernels under 80% of the measured window, so "
                   "the host's kernel launches set its speed. "
                   "`harness report --csv` writes this table as CSV.")


def _bytes(v) -> str:
    return "–" if num(v) is None else format_bytes(num(v))


def _n(v, fmt: str) -> str:
    return "–" if num(v) is None else e(fmt.format(num(v)))


def _step(median, p10, p90) -> str:
    if num(median) is None:
        return "–"
    scale, unit = (1e3, "ms") if num(median) < 1 else (1, "s")
    lo, hi = (f"{x * scale:.3g}" if num(x) is not None else "?" for x in (p10, p90))
    return e(f"{num(median) * scale:.3g} {unit} ({lo}–{hi})")


def failures_html(run: Run) -> str:
    t = run.trials
    bad = t[t["status"] != "ok"]
    if not len(bad):
        return section("failures", "Failures", '<p class="empty">Every trial finished.</p>')
    groups: dict[tuple[str, str], list[str]] = {}
    for tid, st, why in zip(bad.index, bad["status"], bad["reason_short"], strict=True):
        key = (st, re.sub(r"\d+(\.\d+)?", "#", why or "no reason recorded"))
        groups.setdefault(key, []).append(tid)
    out = []
    for (st, _), ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first = run.records[ids[0]]
        reason = str(first.get("reason") or "no reason recorded")
        tail = (first.get("metrics") or {}).get("traceback_tail") or ""
        shown = ", ".join(ids[:30]) + (f" and {len(ids) - 30} more" if len(ids) > 30 else "")
        out.append(f"<li>{status(st)} <b>{len(ids)}×</b> {e(reason.split(chr(10))[0])}"
                   f'<div class="note">trials {e(shown)}</div>'
                   f"<details><summary>details of trial {e(ids[0])}</summary>"
                   f"<pre>{e(reason)}</pre>{f'<pre>{e(tail)}</pre>' if tail else ''}"
                   "</details></li>")
    return section("failures", "Failures, grouped by reason", f"<ul>{''.join(out)}</ul>",
                   f"{len(bad)} of {len(t)} trials did not finish. Pruned trials were stopped by "
                   "the tuner — predicted not to fit (never launched), too slow after a few "
                   "steps, or out of time; the reason says which.")


def study_html(run: Run) -> str:
    s = run.study
    keys = ("name", "objective", "directions", "device", "budget_s", "memory_budget_bytes",
            "started_at", "finished_at", "stopped_because", "n_trials", "best_trial_id",
            "baseline_trial_id", "storage", "harness_version")
    rows = [(k, s[k]) for k in keys if k in s]
    rows += [(k, v) for k, v in s.items() if k not in keys]
    if run.memory_budget:
        rows.append(("memory budget", format_bytes(run.memory_budget)))
    toml = run.path / "study.toml"
    inner = kv_table(rows)
    if toml.is_file():
        inner += ("<details><summary>study.toml</summary>"
                  f"<pre>{e(toml.read_text(errors='replace'))}</pre></details>")
    return section("study", "The study", inner)
