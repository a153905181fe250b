"""`harness compare RUN_DIR RUN_DIR...`: studies side by side (two clusters, two torch
versions, two workloads): best configurations, speedups, per-technique effects.

Every figure is a configuration's pooled measurements (training_harness.records.pooled), and
every ratio between two runs (each best over the first run's, each configuration
measured in both) carries its 95% interval and verdict (training_harness.records.speedup).
Ratios of samples/s are made only between runs that train the same thing (the workload and
its arguments, its sequence length, the global batch: `apart`); runs that do not are set
side by side by what compares across them, tokens/s per device and MFU."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from training_harness.core.target import KERNEL_ARGS
from training_harness.core.units import format_bytes
from training_harness.records.pooled import Pooled, compare, pool
from training_harness.reports.effects import Effects, technique_effects
from training_harness.reports.environment import environment
from training_harness.reports.figures_perf import measured, pareto_front
from training_harness.reports.headline import Headline, headline
from training_harness.reports.html import e, figure, page, section
from training_harness.reports.load import Run
from training_harness.reports.style import (
    COLORS,
    TEMPLATE,
    Figure,
    esc,
    memory_unit,
    new_figure,
    pct,
    rate,
)


def build_compare(runs: list[Run]) -> str:
    heads = [headline(r) for r in runs]
    effects = [technique_effects(r) for r in runs]
    labels = _labels(runs)
    differ = apart(runs, labels)
    figs = [speedups(labels, heads), effects_side_by_side(labels, effects),
            fronts(labels, runs)]
    table = summary_table(runs, labels, heads, effects, differ)
    if differ:
        table = (f'<p class="note">These runs train different things ({e("; ".join(differ))}): '
                 "a samples/s of one is not a samples/s of the other, so no ratio between them "
                 "is made; tokens/s per device and MFU compare across them.</p>" + table)
    body = [section("summary", "Side by side", table)]
    body += [figure(f) for f in figs]
    same = ('<p class="empty">Not shown: the runs train different things, so the same '
            "configuration's samples/s do not compare.</p>" if differ
            else same_configs(runs, labels))
    body.append(section("same", "The same configurations in each run", same,
                        "Configurations measured (status ok) in every run, by the first run's "
                        "throughput: each the median of every quiet measurement of it in that "
                        "run, and n; the ratio is each run's over the first run's, with its "
                        "95% interval and verdict (docs/measuring.md)."))
    notes = [(lab, n) for lab, r in zip(labels, runs, strict=True) for n in r.notes]
    if notes:
        body.append(section("notes", "Notes on the records", "<ul>" + "".join(
            f"<li>{e(lab)}: {e(n)}</li>" for lab, n in notes) + "</ul>"))
    nav = [("summary", "Side by side"), ("speedups", "Speedups"), ("effects", "Techniques"),
           ("fronts", "Throughput × memory"), ("same", "Same configurations")]
    return page("Comparison: " + " vs ".join(labels), f"{len(runs)} runs: "
                + ", ".join(str(r.path) for r in runs), nav, "".join(body))


def ratio_lines(runs: list[Run]) -> list[str]:
    """For the terminal: each run's best over the first run's best, pooled, with its
    interval and verdict; for runs that train different things, what compares instead."""
    heads = [headline(r) for r in runs]
    labels = _labels(runs)
    differ = apart(runs, labels)
    if differ:
        return [f"these runs train different things ({'; '.join(differ)}): no ratio of "
                "samples/s is made; what compares across them:"] + [
            f"  {lab}: best {_best(h, 'tokens_per_s', _per_device(h))} tokens/s per device, "
            f"MFU {_best(h, 'mfu', pct)}" for lab, h in zip(labels, heads, strict=True)]
    return [f"{lab}: best over {labels[0]}'s best: {text}" for lab, text in
            zip(labels[1:], _best_over_first(heads)[1:], strict=True)]


def trained(run: Run) -> dict[str, Any]:
    """What a run's samples/s are samples of: the workload with its arguments (less the
    kernel choices a study searches), and the global batch, of its best (else first) trial."""
    records = run.records
    record = records.get(run.best_id or "") or next(iter(records.values()), {})
    plan = record.get("plan") or {}
    workload = {"name": plan.get("workload"), **(plan.get("workload_args") or {})}
    return {"workload": {k: v for k, v in workload.items() if k not in KERNEL_ARGS},
            "global batch": plan.get("global_batch_size")}


def apart(runs: list[Run], labels: list[str]) -> list[str]:
    """How each run differs from the first in what it trains, in words; [] when they all
    train the same thing (their samples/s then compare)."""
    first = trained(runs[0])
    said = []
    for lab, run in zip(labels[1:], runs[1:], strict=True):
        mine = trained(run)
        a, b = first["workload"], mine["workload"]
        if a.get("name") != b.get("name"):
            said.append(f"{lab} trains {b.get('name')}, {labels[0]} {a.get('name')}")
        else:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            if keys:
                said.append(f"{lab}'s {a.get('name')} differs in " + ", ".join(
                    f"{k} ({b.get(k)} against {a.get(k)})" for k in keys))
        if mine["global batch"] != first["global batch"]:
            said.append(f"{lab}'s global batch is {mine['global batch']}, "
                        f"{labels[0]}'s {first['global batch']}")
    return said


def _per_device(h: Headline):
    """A formatter of the best's tokens/s divided over its devices."""
    world = 1 if h.best is None else (h.best.get("world_size") or 1)
    world = 1 if world != world else world  # NaN
    return lambda v: rate(v / world)


def _labels(runs: list[Run]) -> list[str]:
    names = [r.name for r in runs]
    return [n if names.count(n) == 1 else f"{n} ({r.path})" for n, r in zip(names, runs,
                                                                              strict=True)]


def summary_table(runs, labels, heads: list[Headline], effects: list[Effects],
                  differ: list[str] | None = None) -> str:
    rows: list[tuple[str, list[str]]] = []
    envs = [{k: v for k, v, _ in environment(r)} for r in runs]
    for key in ("device_name", "gpu_names", "cpu_capability", "cpu_flags", "torch", "cuda",
                "driver", "harness", "hostname"):
        rows.append((key, [env.get(key, "–") for env in envs]))
    rows.append(("trials", [", ".join(f"{n} {s}" for s, n in sorted(h.counts.items())) or "none"
                            for h in heads]))
    rows.append(("best configuration", [_best(h, "config") for h in heads]))
    rows.append(("layout, micro-batch", [
        "–" if h.best is None else f"{h.best['layout']}, {h.best['micro_batch_size']:g}"
        for h in heads]))
    rows.append(("best samples/s", [_pooled(h, "best") or _best(h, "samples_per_s", rate)
                                    for h in heads]))
    rows.append(("baseline samples/s", [_pooled(h, "baseline") or ("–" if h.baseline is None
                                                                   else rate(h.baseline[
                                                                       "samples_per_s"]))
                                        for h in heads]))
    rows.append(("speedup over fp32", [f"{h.speedup:.2f}× ({h.basis})" if h.speedup else
                                       (" ".join(h.missing) or "–") for h in heads]))
    rows.append((f"best over {labels[0]}'s best", ["–"] + ["not comparable: they train "
                                                          "different things"] * (len(heads) - 1)
                 if differ else _best_over_first(heads)))
    rows.append(("best tokens/s per device", [_best(h, "tokens_per_s", _per_device(h))
                                              for h in heads]))
    rows.append(("best peak memory", [_best(h, "peak_memory_bytes", format_bytes) for h in heads]))
    rows.append(("best MFU", [_best(h, "mfu", pct) for h in heads]))
    techniques = sorted({x.technique for ef in effects for x in ef.items})
    for name in techniques:
        rows.append((f"{name}: effect", [next((x.verdict for x in ef.items
                                               if x.technique == name), "–")
                                         for ef in effects]))
    head = "".join(f"<th>{e(lab)}</th>" for lab in labels)
    body = "".join(
        f'<tr{" class=differs" if len(set(vals)) > 1 else ""}><th>{e(k)}</th>'
        + "".join(f"<td>{e(v)}</td>" for v in vals) + "</tr>" for k, vals in rows)
    return (f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"
            '<p class="note">Rows in bold differ between the runs.</p>'
            "<style>tr.differs th{font-weight:700;color:#0b5cad}</style>")


def _pooled(h: Headline, which: str) -> str:
    """A headline's pooled figure ('80.22 samples/s median [73.7, 85.08], n=5'), or ''."""
    p = getattr(h.study, which, None)
    return p.text() if p is not None else ""


def _best_over_first(heads: list[Headline]) -> list[str]:
    """Each run's best over the first run's, both pooled, with the interval."""
    first = getattr(heads[0].study, "best", None)
    mine = [getattr(h.study, "best", None) for h in heads[1:]]
    return ["–"] + [compare(m, first).text() if m and first else "–" for m in mine]


def _best(h: Headline, key: str, fmt=str) -> str:
    if h.best is None:
        return "–"
    v = h.best[key]
    return "–" if v is None or v != v else fmt(v)


def speedups(labels, heads: list[Headline]) -> Figure:
    title = "Best against baseline, per run"
    if not any(h.best is not None for h in heads):
        return Figure("speedups", title, None, empty="No run has a finished trial.")
    fig = new_figure(360, yaxis_title="samples/s", barmode="group",
                     legend={"orientation": "h", "y": -0.2})
    x = [esc(lab, 50) for lab in labels]
    for name, key, color in (("fp32 baseline", "baseline", "#7f8c8d"), ("best", "best", COLORS[0])):
        y = [_figure(h, key) for h in heads]
        text = [f"{h.speedup:.2f}×" if key == "best" and h.speedup else "" for h in heads]
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker_color=color, text=text,
                             textposition="outside"))
    return Figure("speedups", title, fig, caption="Throughput of each run's fp32 baseline and "
                  "best configuration, each the median of every quiet measurement of it; the "
                  "label is the speedup within that run (its interval: the table above).")


def _figure(h: Headline, which: str) -> float | None:
    """The pooled median of a run's best or baseline, else its one trial's figure."""
    p = getattr(h.study, which, None)
    row = getattr(h, which)
    return p.median if p is not None else None if row is None else row["samples_per_s"]


def effects_side_by_side(labels, effects: list[Effects]) -> Figure:
    title = "What each technique bought, per run"
    techniques = sorted({x.technique for ef in effects for x in ef.items})
    if not techniques:
        return Figure("effects", title, None, empty="No run has leave-one-out trials or pairs of "
                      "trials that differ in one technique.")
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("throughput: with it vs without it (%)",
                                        "peak memory it saves (GiB)"))
    fig.update_layout(template=TEMPLATE, height=max(300, 90 + 40 * len(techniques) * len(labels)),
                      barmode="group", legend={"orientation": "h", "y": -0.15})
    clipped = False
    for i, (lab, ef) in enumerate(zip(labels, effects, strict=True)):
        by = {x.technique: x for x in ef.items}
        xs = [by.get(t) for t in techniques]
        pct = [None if x is None or x.speedup is None else (x.speedup - 1) * 100 for x in xs]
        hi = [None if p is None else _clipped(x.speedup_hi, CLIP_HI) for x, p in
              zip(xs, pct, strict=True)]
        lo = [None if p is None else _clipped(x.speedup_lo, CLIP_LO) for x, p in
              zip(xs, pct, strict=True)]
        clipped |= any(c for c in hi + lo if c is not None and c[1])
        err = {"type": "data", "symmetric": False,
               "array": [0 if c is None else (c[0] - x.speedup) * 100
                         for x, c in zip(xs, hi, strict=True)],
               "arrayminus": [0 if c is None else (x.speedup - c[0]) * 100
                              for x, c in zip(xs, lo, strict=True)]}
        mem = [None if x is None or x.memory_saved is None else x.memory_saved / 2**30
               for x in xs]
        color = COLORS[i % len(COLORS)]
        ys = [esc(t) for t in techniques]
        fig.add_trace(go.Bar(y=ys, x=pct, orientation="h", name=esc(lab, 50), error_x=err,
                             marker_color=color, legendgroup=str(i)), row=1, col=1)
        fig.add_trace(go.Bar(y=ys, x=mem, orientation="h", name=esc(lab, 50), showlegend=False,
                             marker_color=color, legendgroup=str(i)), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    sources = "; ".join(f"{lab}: {ef.source}" for lab, ef in zip(labels, effects, strict=True))
    cut = (f" Intervals reaching past {CLIP_LO - 1:+.0%} or {CLIP_HI - 1:+.0%} (or with no "
           "end: too few measurements) are drawn clipped there; the table gives them whole."
           if clipped else "")
    return Figure("effects", title, fig, caption=f"Where the effects come from — {sources} "
                  "(ablation: repeated leave-one-out trials; pairs: single search trials)."
                  + cut)


CLIP_LO, CLIP_HI = 0.0, 3.0  # the effects chart's error bars, as ratios: -100% to +200%


def _clipped(end: float | None, bound: float) -> tuple[float, bool]:
    """An interval's end as drawn (`bound`: CLIP_HI for its upper end, CLIP_LO for its
    lower), and whether it was cut: an end past the chart's range, or none at all (an
    interval open on that side)."""
    if end is None or end != end or end in (float("inf"), float("-inf")):
        return bound, True
    drawn = min(max(end, CLIP_LO), CLIP_HI)
    return drawn, drawn != end


def fronts(labels, runs: list[Run]) -> Figure:
    title = "Throughput against peak memory, per run"
    parts = [measured(r, ablation=False) for r in runs]
    parts = [p[p["peak_memory_bytes"].notna()] for p in parts]
    if not any(len(p) for p in parts):
        return Figure("fronts", title, None, empty="No run has a measured trial.")
    div, unit = memory_unit([v for p in parts for v in p["peak_memory_bytes"]])
    fig = new_figure(440, xaxis_title=f"peak memory per device ({unit})", yaxis_title="samples/s",
                     legend={"orientation": "h", "y": -0.2})
    for i, (lab, p) in enumerate(zip(labels, parts, strict=True)):
        color, front = COLORS[i % len(COLORS)], pareto_front(p)
        fig.add_trace(go.Scatter(x=p["peak_memory_bytes"] / div, y=p["samples_per_s"],
                                 mode="markers", name=esc(lab, 50), marker={
                                     "color": color, "opacity": 0.45, "size": 7},
                                 text=[esc(c, 80) for c in p["label"]],
                                 hovertemplate="%{text}<br>%{y:.4g} samples/s<extra></extra>"))
        fig.add_trace(go.Scatter(x=front["peak_memory_bytes"] / div, y=front["samples_per_s"],
                                 mode="lines", line_shape="hv", line={"color": color, "width": 2},
                                 name=esc(lab, 40) + " front", hoverinfo="skip"))
    return Figure("fronts", title, fig, caption="Each run's trials and its Pareto front.")


def same_configs(runs: list[Run], labels: list[str], limit: int = 20) -> str:
    keyed = [_pooled_by_label(r) for r in runs]
    common = set(keyed[0]).intersection(*[set(k) for k in keyed[1:]])
    if not common:
        return '<p class="empty">No configuration was measured in every run.</p>'
    order = sorted(common, key=lambda k: -keyed[0][k].median)[:limit]
    head = "".join(f"<th>{e(lab)}</th>" for lab in labels)
    rows = "".join(
        f"<tr><td>{e(k)}</td>" + "".join(
            f'<td class="n">{e(rate(s[k].median))}, n={s[k].n}'
            + (f" ({e(compare(s[k], keyed[0][k]).text())})" if i else "") + "</td>"
            for i, s in enumerate(keyed)) + "</tr>" for k in order)
    return (f"<table><thead><tr><th>configuration | layout | micro-batch</th>{head}</tr>"
            f"</thead><tbody>{rows}</tbody></table>")


def _pooled_by_label(run: Run) -> dict[str, Pooled]:
    """Each configuration's pooled measurements, by 'configuration | layout | mb N'."""
    out: dict[str, Pooled] = {}
    t = run.trials
    for p in pool(list(run.records.values())).values():
        tid = p.measurements[0].trial_id
        if tid not in t.index:
            continue
        row = t.loc[tid]
        mbs = row["micro_batch_size"]
        key = f"{row['config']} | {row['layout']} | mb {'?' if mbs != mbs else f'{mbs:g}'}"
        out.setdefault(key, p)
    return out
