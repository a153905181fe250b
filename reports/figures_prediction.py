"""The step-time prediction's error as the study learns: the estimator's own, and the
tuner's correction from the trials measured before each one (its record's
predicted.corrected_step_time_s and corrected_from_trials)."""

from __future__ import annotations

import plotly.graph_objects as go

from training_harness.reports.load import Run
from training_harness.reports.style import Figure, esc, new_figure

TITLE = "Step-time prediction error against the trials it learnt from"


def step_time_prediction(run: Run) -> Figure:
    t = run.trials
    rows = t[t["step_time_median"].notna() & t["corrected_step_time_s"].notna()
             & t["predicted_step_time_s"].notna() & t["corrected_from_trials"].notna()]
    if not len(rows):
        return Figure("steptime", TITLE, None, empty="No trial has a measured step time next "
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
    return Figure("steptime", TITLE, fig, caption="Each trial's step time as predicted "
                  "before it ran, against what it measured. " + " ".join(words))
