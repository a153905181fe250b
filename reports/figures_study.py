"""Figures of the study itself: what each technique bought, the optimisation history,
parameter importances, and the estimator's memory error."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from training_harness.reports.effects import Effects
from training_harness.reports.load import Run
from training_harness.reports.style import (
    BEST,
    PHASE_COLORS,
    REPEATS,
    STATUS_COLORS,
    TEMPLATE,
    Figure,
    esc,
    memory_unit,
    new_figure,
)


def effects_figure(effects: Effects) -> Figure:
    title = "What each technique bought"
    items = effects.items
    if not items:
        return Figure("effects", title, None, empty=effects.note)
    div, unit = memory_unit([e.memory_saved_hi for e in items] + [e.memory_saved_lo for e in items])
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("throughput: with it vs without it (%)",
                                        f"peak memory it saves ({unit})"))
    fig.update_layout(template=TEMPLATE, height=max(260, 90 + 46 * len(items)), showlegend=False,
                      bargap=0.35, margin={"t": 60})
    names = [esc(e.technique) for e in items]
    pct = [None if e.speedup is None else (e.speedup - 1) * 100 for e in items]
    lo = [0 if e.speedup is None else (e.speedup - e.speedup_lo) * 100 for e in items]
    hi = [0 if e.speedup is None else (e.speedup_hi - e.speedup) * 100 for e in items]
    colors = ["#95a5a6" if e.clear is False else ("#2e9e6a" if (p or 0) >= 0 else "#c0392b")
              for e, p in zip(items, pct, strict=True)]
    hover = [esc(e.verdict) + f"<br>{e.n} measurement(s) without it, {e.n_reference} with it"
             for e in items]
    fig.add_trace(go.Bar(y=names, x=pct, orientation="h", marker_color=colors,
                         error_x={"type": "data", "symmetric": False, "array": hi,
                                  "arrayminus": lo, "color": "#333"},
                         hovertext=hover, hoverinfo="text"), row=1, col=1)
    saved = [None if e.memory_saved is None else e.memory_saved / div for e in items]
    mlo = [0 if e.memory_saved is None else (e.memory_saved - e.memory_saved_lo) / div
           for e in items]
    mhi = [0 if e.memory_saved is None else (e.memory_saved_hi - e.memory_saved) / div
           for e in items]
    fig.add_trace(go.Bar(y=names, x=saved, orientation="h", marker_color="#3366cc",
                         error_x={"type": "data", "symmetric": False, "array": mhi,
                                  "arrayminus": mlo, "color": "#333"},
                         hovertext=hover, hoverinfo="text"), row=1, col=2)
    for e, name in zip(items, names, strict=True):
        if e.speedup is None:
            fig.add_annotation(x=0, y=name, xref="x", yref="y", xanchor="left", showarrow=False,
                               text=" " + esc(e.verdict, 70), font={"color": "#c0392b"})
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(zeroline=True, zerolinecolor="#555")
    caption = effects.note + (" Grey bars: not distinguishable at this n (the interval "
                              "reaches within the 2% noise threshold)."
                              if any(e.clear is False for e in items) else "")
    return Figure("effects", title, fig, caption=caption)


def history(run: Run) -> Figure:
    title = "Optimisation history"
    t = run.trials
    if len(t) < 2:
        return Figure("history", title, None, empty=f"{len(t)} trial(s): there is no history.")
    x = t["optuna_number"].where(t["optuna_number"].notna(), t["order"])
    fig = new_figure(380, xaxis_title="trial (Optuna's number where recorded, else order)",
                     yaxis_title="samples/s", legend={"orientation": "h", "y": -0.22})
    ok = t["status"] == "ok"
    for phase, part in t[ok].groupby("phase", sort=False):
        fig.add_trace(go.Scatter(
            x=x[part.index], y=part["samples_per_s"], mode="markers",
            name=esc(phase or "trial"), text=[esc(c, 80) for c in part["label"]],
            customdata=[esc(i) for i in part.index],
            hovertemplate="trial %{customdata}<br>%{text}<br>%{y:.4g} samples/s<extra></extra>",
            marker={"color": PHASE_COLORS.get(str(phase), "#3366cc"), "size": 7}))
    search = t[ok & ~t["phase"].isin(REPEATS)].assign(_x=x).sort_values("_x")
    if len(search):
        fig.add_trace(go.Scatter(x=search["_x"], y=search["samples_per_s"].cummax(),
                                 mode="lines", line={"color": BEST, "shape": "hv", "width": 2},
                                 name="best so far", hoverinfo="skip"))
    for status, part in t[~ok].groupby("status"):
        fig.add_trace(go.Scatter(
            x=x[part.index], y=[0] * len(part), mode="markers", name=esc(status),
            text=[esc(r, 120) for r in part["reason_short"]],
            customdata=[esc(i) for i in part.index],
            hovertemplate="trial %{customdata}: %{text}<extra></extra>",
            marker={"symbol": "x", "size": 8, "color": STATUS_COLORS.get(str(status), "#555")}))
    return Figure("history", title, fig, caption=(
        "Each trial's throughput in the order the tuner ran it, and the best so far; trials "
        "that did not finish sit on the x-axis."))


def importances_figure(importances: dict[str, float] | None, note: str) -> Figure:
    title = "Parameter importances"
    if not importances:
        return Figure("importances", title, None, empty=note)
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig = new_figure(max(220, 60 + 30 * len(items)), xaxis_title="importance (sums to 1)",
                     showlegend=False)
    fig.add_trace(go.Bar(y=[esc(k) for k, _ in items], x=[v for _, v in items], orientation="h",
                         marker_color="#3366cc", hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    return Figure("importances", title, fig, caption=note)
