"""The estimator's predictions against what the trials measured: peak memory (the
estimator's error, and its correction by the tuner where the records hold one), and the
step time as the study learns (the estimator's own, and the tuner's correction from the
trials measured before each one: predicted.corrected_step_time_s, corrected_from_trials)."""

from __future__ import annotations

import plotly.graph_objects as go

from training_harness.reports.load import Run
from training_harness.reports.style import Figure, esc, memory_unit, new_figure

MEMORY_TITLE = "Predicted against measured peak memory (the estimator's error)"
STEP_TITLE = "Step-time prediction error against the trials it learnt from"


def _error_text(name: str, err) -> str:
    worst = err.loc[err.abs().idxmax()]
    return (f"{name}: median error {err.median():+.0f}%, median |error| "
            f"{err.abs().median():.0f}%, worst {worst:+.0f}% over {len(err)} trial(s).")


def memory_prediction(run: Run) -> Figure:
    t = run.trials
    raw = t[t["measured_for_estimate"].notna() & t["predicted_memory_bytes"].notna()]
    cal = t[t["peak_memory_bytes"].notna() & t["calibrated_memory_bytes"].notna()]
    if not len(raw) and not len(cal):
        return Figure("memory", MEMORY_TITLE, None, empty="No trial has both a predicted and a "
                      "measured peak memory.")
    cpu = (raw["device_kind"] == "cpu").any()
    series = [("estimator", raw, "predicted_memory_bytes", "measured_for_estimate", "#3366cc"),
              ("corrected by the tuner", cal, "calibrated_memory_bytes", "peak_memory_bytes",
               "#dc7633")]
    series = [s for s in series if len(s[1])]
    div, unit = memory_unit([v for _, d, x, y, _ in series for v in (*d[x], *d[y])])
    top = max(max(d[x].max(), d[y].max()) for _, d, x, y, _ in series) / div * 1.05
    fig = new_figure(440, xaxis_title=f"predicted ({unit})", yaxis_title=f"measured ({unit})",
                     legend={"orientation": "h", "y": -0.2})
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", hoverinfo="skip",
                             name="prediction = measurement", line={"color": "#999",
                                                                    "dash": "dot"}))
    words = []
    for name, d, x, y, color in series:
        err = (d[x] / d[y] - 1) * 100
        words.append(_error_text(name.capitalize(), err))
        fig.add_trace(go.Scatter(
            x=d[x] / div, y=d[y] / div, mode="markers", name=name,
            customdata=[[esc(i), esc(c, 80), f"{e:+.0f}%"]
                        for i, c, e in zip(d.index, d["label"], err, strict=True)],
            hovertemplate="trial %{customdata[0]}<br>%{customdata[1]}<br>predicted %{x:.3g}, "
                          "measured %{y:.3g}<br>error %{customdata[2]}<extra></extra>",
            marker={"size": 8, "color": color, "opacity": 0.8}))
    fig.update_xaxes(range=[0, top])
    fig.update_yaxes(range=[0, top])
    note = (" On a CPU the estimator is compared with the process RSS above its start (the "
            "Python runtime and libraries are not the model's); the corrected prediction, "
            "with the whole peak." if cpu else "")
    return Figure("memory", MEMORY_TITLE, fig, caption="Points under the dotted line were "
                  "over-predicted. " + " ".join(words) + note)


def step_time_prediction(run: Run) -> Figure:
    t = run.trials
    rows = t[t["step_time_median"].notna() & t["corrected_step_time_s"].notna()
             & t["predicted_step_time_s"].notna() & t["corrected_from_trials"].notna()]
    if not len(rows):
        return Figure("steptime", STEP_TITLE, None, empty="No trial has a measured step time next "
                      "to a corrected prediction (records from before the tuner kept one, or "
                      "a bench run).")
    rows = rows.sort_values("corrected_from_trials")
    fig = new_figure(400, xaxis_title="trials the correction had learnt from",
                     yaxis_title="|error| of the predicted step time (%)",
                     legend={"orientation": "h", "y": -0.25})
    words = []
    for name, column, color in (("estimator", "predicted_step_time_s", "#3366cc"),
                                ("corrected by the tuner", "corrected_step_time_s", "#dc7633")):
        err = (rows[column] / rows["step_time_median"] - 1).abs() * 100
        fig.add_trace(go.Scatter(
            x=rows["corrected_from_trials"], y=err, mode="markers", name=name,
            customdata=[[esc(i), esc(c, 80)] for i, c in zip(rows.index, rows["label"],
                                                             strict=True)],
            hovertemplate="trial %{customdata[0]}<br>%{customdata[1]}<br>|error| %{y:.0f}%"
                          "<extra></extra>",
            marker={"size": 8, "color": color, "opacity": 0.8}))
        first, last = err.iloc[: max(1, len(err) // 4)], err.iloc[-max(1, len(err) // 4):]
        words.append(f"{name.capitalize()}: median |error| {first.median():.0f}% over the "
                     f"first quarter of the trials, {last.median():.0f}% over the last.")
    return Figure("steptime", STEP_TITLE, fig, caption="Each trial's step time as predicted "
                  "before it ran, against what it measured. " + " ".join(words))
