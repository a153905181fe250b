"""Figures of measured performance: throughput against memory, micro-batch size, step-time
distributions, loss curves. Each function takes a loaded Run and returns a style.Figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from training_harness.core.units import format_bytes
from training_harness.reports.load import Run
from training_harness.reports.style import (
    BASELINE,
    BEST,
    COLORS,
    REPEATS,
    STATUS_COLORS,
    TEMPLATE,
    Figure,
    esc,
    memory_unit,
    new_figure,
    num,
)

HOVER = ("trial %{customdata[0]}<br>%{customdata[1]}<br>layout %{customdata[2]}, "
         "micro-batch %{customdata[3]}<br>%{y:.4g} samples/s, %{x:.3g} {unit}<extra></extra>")


def _custom(df: pd.DataFrame) -> list[list[str]]:
    return [[esc(r.trial_id), esc(r.label, 90), esc(r.layout),
             "?" if num(r.micro_batch_size) is None else f"{r.micro_batch_size:g}"]
            for r in df.itertuples()]


def measured(run: Run, ablation: bool = True) -> pd.DataFrame:
    t = run.trials
    ok = t[(t["status"] == "ok") & t["samples_per_s"].notna()]
    return ok if ablation else ok[~ok["phase"].isin(REPEATS)]


def pareto_front(df: pd.DataFrame) -> pd.DataFrame:
    """Trials no other trial beats on both throughput (higher) and peak memory (lower)."""
    d = df[df["peak_memory_bytes"].notna()].sort_values(["peak_memory_bytes", "samples_per_s"],
                                                       ascending=[True, False])
    keep, top = [], float("-inf")
    for tid, thr in zip(d.index, d["samples_per_s"], strict=True):
        if thr > top:
            keep.append(tid)
            top = thr
    return d.loc[keep]


def throughput_memory(run: Run) -> Figure:
    ok = measured(run)
    ok = ok[ok["peak_memory_bytes"].notna()]
    title = "Throughput against peak memory"
    if not len(ok):
        return Figure("pareto", title, None, empty="No trial finished with a throughput and a "
                      "peak memory: nothing to place on this plane.")
    t = run.trials
    lost = t[(t["status"] != "ok") & t["predicted_memory_bytes"].notna()]
    budget = run.memory_budget
    xs = list(ok["peak_memory_bytes"]) + list(lost["predicted_memory_bytes"])
    far = budget is not None and budget > 2.5 * max(v for v in map(num, xs) if v is not None)
    div, unit = memory_unit(xs + ([budget] if budget and not far else []))
    hover = HOVER.replace("{unit}", unit)
    fig = new_figure(460, xaxis_title=f"peak memory per device ({unit})",
                     yaxis_title="samples/s", legend={"orientation": "h", "y": -0.18})
    front = pareto_front(ok[~ok["phase"].isin(REPEATS)])
    for name, part, color, size in (("search trials", ok[~ok["phase"].isin(REPEATS)], COLORS[0], 8),
                                    ("ablation trials", ok[ok["phase"] == "ablation"],
                                     "#b39ddb", 7)):
        if len(part):
            fig.add_trace(go.Scatter(x=part["peak_memory_bytes"] / div, y=part["samples_per_s"],
                                     mode="markers", name=name, customdata=_custom(part),
                                     hovertemplate=hover,
                                     marker={"color": color, "size": size, "opacity": 0.75}))
    fig.add_trace(go.Scatter(x=front["peak_memory_bytes"] / div, y=front["samples_per_s"],
                             mode="lines+markers", name="Pareto front", line_shape="hv",
                             customdata=_custom(front), hovertemplate=hover,
                             line={"color": "#2e9e6a", "width": 2},
                             marker={"color": "#2e9e6a", "size": 9}))
    for tid, label, color, symbol in ((run.baseline_id, "fp32 baseline", BASELINE, "diamond"),
                                      (run.best_id, "best", BEST, "star")):
        r = ok.loc[[tid]] if tid in ok.index else None
        if r is not None:
            fig.add_trace(go.Scatter(x=r["peak_memory_bytes"] / div, y=r["samples_per_s"],
                                     mode="markers", name=label, customdata=_custom(r),
                                     hovertemplate=hover, marker={
                                         "color": color, "size": 16, "symbol": symbol,
                                         "line": {"color": "#222", "width": 1}}))
    for status, part in lost.groupby("status"):
        fig.add_trace(go.Scatter(
            x=part["predicted_memory_bytes"] / div, y=[0] * len(part), mode="markers",
            name=f"{esc(status)} (at predicted memory)", customdata=_custom(part),
            hovertemplate="trial %{customdata[0]}<br>%{customdata[1]}<br>" + esc(status)
            + f", predicted %{{x:.3g}} {unit}<extra></extra>",
            marker={"color": STATUS_COLORS.get(str(status), "#555"), "symbol": "x", "size": 9}))
    if budget and not far:
        fig.add_vline(x=budget / div, line={"color": "#c0392b", "dash": "dash"},
                      annotation_text=f"memory budget {budget / div:.3g} {unit}",
                      annotation_position="top left")
    note = (f" The memory budget, {format_bytes(budget)}, is far to the right of every "
            "trial and is not drawn." if far else "")
    return Figure("pareto", title, fig, caption=(
        "Up and to the left is better. The green line is the Pareto front of the search: no "
        "other configuration is both faster and smaller. Trials that did not run to the end "
        "sit on the x-axis at the memory the estimator predicted for them." + note))


def micro_batch(run: Run) -> Figure:
    ok = measured(run, ablation=False)
    ok = ok[ok["micro_batch_size"].notna()]
    title = "Throughput and memory against micro-batch size, per layout"
    if ok["micro_batch_size"].nunique() < 2:
        sizes = ", ".join(f"{v:g}" for v in sorted(ok["micro_batch_size"].unique()))
        return Figure("mbs", title, None, empty=(
            f"Every measured trial used micro-batch size {sizes}: nothing to plot against."
            if sizes else "No measured trial records a micro-batch size."))
    div, unit = memory_unit(ok["peak_memory_bytes"])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("samples/s", f"peak memory ({unit})"))
    fig.update_layout(template=TEMPLATE, height=420, margin={"t": 60},
                      legend={"title": {"text": "layout dxpxt"}})
    for i, (layout, part) in enumerate(ok.groupby("layout", sort=True)):
        color = COLORS[i % len(COLORS)]
        fastest = part.loc[part.groupby("micro_batch_size")["samples_per_s"].idxmax()]
        fastest = fastest.sort_values("micro_batch_size")
        cd = _custom(fastest)
        for col, y in ((1, fastest["samples_per_s"]), (2, fastest["peak_memory_bytes"] / div)):
            fig.add_trace(go.Scatter(
                x=fastest["micro_batch_size"], y=y, mode="lines+markers", name=esc(layout),
                legendgroup=esc(layout), showlegend=col == 1, customdata=cd,
                line={"color": color}, marker={"size": 8},
                hovertemplate="trial %{customdata[0]}<br>%{customdata[1]}<br>micro-batch "
                              "%{x}: %{y:.4g}<extra></extra>"), row=1, col=col)
        for col, y in ((1, part["samples_per_s"]), (2, part["peak_memory_bytes"] / div)):
            fig.add_trace(go.Scatter(x=part["micro_batch_size"], y=y, mode="markers",
                                     legendgroup=esc(layout), showlegend=False,
                                     marker={"color": color, "size": 5, "opacity": 0.3},
                                     hoverinfo="skip"), row=1, col=col)
    fig.update_xaxes(type="log", title_text="micro-batch size", dtick=0.30103)
    return Figure("mbs", title, fig, caption=(
        "Each line follows the fastest configuration at each micro-batch size, for one "
        "parallel layout (data × pipeline × tensor); faint dots are all other trials."))


def top_configs(run: Run, n: int) -> pd.DataFrame:
    ok = measured(run, ablation=False)
    ok = ok[ok["duplicate_of"].isna() | (ok.index == run.best_id)]
    top = ok.sort_values("samples_per_s", ascending=False).head(n)
    if run.baseline_id in ok.index and run.baseline_id not in top.index:
        top = pd.concat([top, ok.loc[[run.baseline_id]]])
    return top


def _label(run: Run, r) -> str:
    tag = " (baseline)" if r.trial_id == run.baseline_id else (
        " (best)" if r.trial_id == run.best_id else "")
    return esc(f"#{r.trial_id}{tag} {r.label}", 60)


def step_times(run: Run, top: int = 6) -> Figure:
    title = "Step-time distributions of the fastest configurations"
    rows = list(top_configs(run, top).itertuples())
    fig = new_figure(80 + 52 * len(rows), showlegend=False, yaxis={"autorange": "reversed"},
                     xaxis_title="samples/s of each measured step (global batch / step time)")
    for r in rows:
        times = (run.records[r.trial_id].get("metrics") or {}).get("step_times_s") or []
        batch = num(r.global_batch_size)
        times = [batch / x for x in times if isinstance(x, (int, float)) and x > 0 and batch]
        if times:
            color = BASELINE if r.trial_id == run.baseline_id else (
                BEST if r.trial_id == run.best_id else COLORS[0])
            fig.add_trace(go.Box(x=times, name=_label(run, r), boxpoints="all", jitter=0.4,
                                 pointpos=0, marker={"color": color, "size": 4},
                                 line={"color": color}))
    if not fig.data:
        return Figure("steps", title, None, empty="No measured trial recorded its step times.")
    return Figure("steps", title, fig, caption=(
        "Every measured step after warm-up, one box per configuration, as throughput so that "
        "configurations with different global batches compare (the median is the trial's "
        "samples/s). A tight box means a trustworthy median; overlapping boxes mean the "
        "difference may be noise."))


def loss_curves(run: Run, top: int = 4) -> Figure:
    title = "Loss over the measured steps, beside the baseline's"
    fig = new_figure(380, xaxis_title="step (after warm-up)", yaxis_title="loss")
    for i, r in enumerate(top_configs(run, top).itertuples()):
        loss = (run.records[r.trial_id].get("metrics") or {}).get("loss") or {}
        values, skip = loss.get("values") or [], int(loss.get("warmup_steps") or 0)
        values = [v if isinstance(v, (int, float)) else None for v in values[skip:]]
        if values:
            base = r.trial_id == run.baseline_id
            fig.add_trace(go.Scatter(
                x=list(range(1, len(values) + 1)), y=values, mode="lines+markers",
                name=_label(run, r), line={"color": BASELINE if base else COLORS[i % 10],
                                           "width": 3 if base else 1.5,
                                           "dash": "dash" if base else "solid"}))
    if not fig.data:
        return Figure("loss", title, None, empty="No measured trial recorded its loss values.")
    return Figure("loss", title, fig, caption=(
        "A technique that changes the numerics (mixed precision, another optimizer) should "
        "follow the baseline's curve closely; the same seed and batches are used in every trial."))
