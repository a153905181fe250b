"""Shared look of the figures, and escaping of record text that goes into a figure.

plotly.js reads trace names, hover text and titles as a small subset of HTML; text
from a record goes through `esc` first, so it is drawn as the characters it holds
(plotly.js turns the entities back into text, never into tags).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

# The one number coercion of records (reports' modules import it from here as `num`)
from training_harness.records.values import number as num  # noqa: F401

COLORS = ["#3366cc", "#dc7633", "#2e9e6a", "#8e44ad", "#c0392b", "#17a2b8", "#7f8c8d",
          "#b7950b", "#d35400", "#2c3e50"]
STATUS_COLORS = {"ok": "#2e9e6a", "oom": "#c0392b", "failed": "#8e2c2c", "timeout": "#b9770e",
                 "diverged": "#8e44ad", "pruned": "#95a5a6"}
PHASE_COLORS = {"baseline": "#222222", "known-good": "#b7950b", "search": "#3366cc",
                "confirm": "#16a085", "ablation": "#8e44ad", "variant": "#d35400",
                "": "#3366cc"}
# Phases after the search (not search trials): the configurations it measured measured
# again, and the best's variants (settings the study's space left out).
REPEATS = ("confirm", "ablation", "variant")
BEST, BASELINE = "#e6a800", "#222222"

_AXIS = {"gridcolor": "#eceff3", "linecolor": "#9aa4b1", "zeroline": False,
         "automargin": True, "ticks": "outside", "tickcolor": "#9aa4b1"}
TEMPLATE = go.layout.Template(layout={
    "font": {"family": "system-ui, -apple-system, 'Segoe UI', sans-serif", "size": 12,
             "color": "#222"},
    "paper_bgcolor": "white", "plot_bgcolor": "white", "colorway": COLORS,
    "xaxis": _AXIS, "yaxis": _AXIS,
    "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
    "hovermode": "closest", "hoverlabel": {"align": "left"},
    "legend": {"bgcolor": "rgba(255,255,255,0.8)"},
})


@dataclass
class Figure:
    """One figure of a page: plotly figure (None when there is nothing to draw) and words."""

    key: str
    title: str
    fig: go.Figure | None
    caption: str = ""         # plain text; escaped by the page
    empty: str = ""           # said instead of a figure when fig is None


def esc(text: Any, limit: int | None = None) -> str:
    """Record text made safe and literal for plotly.js (and shortened to `limit`)."""
    s = "" if text is None else str(text)
    if limit and len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=True)


def new_figure(height: int = 420, **layout: Any) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(template=TEMPLATE, height=height, **layout)
    return fig


def memory_unit(values: Any) -> tuple[float, str]:
    """Divisor and unit name for a set of byte counts."""
    vals = [abs(v) for v in map(num, values) if v is not None]
    top = max(vals) if vals else 0
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if top >= size:
            return float(size), unit
    return 1.0, "B"


def rate(x: float | None) -> str:
    x = num(x)
    if x is None:
        return "–"
    for prefix, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {prefix}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def pct(x: Any) -> str:
    """A fraction as a percentage with three significant digits ("30.6%", "0.0312%")."""
    x = num(x)
    return "–" if x is None else f"{x * 100:.3g}%"
