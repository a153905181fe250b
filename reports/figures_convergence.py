"""Time to a target validation loss (objective time_to_loss): the validation loss of each
configuration against samples and against its own wall-clock, the steps to target by
global batch and technique (MLPerf's convergence points), and the headline's figures.

Each record's metrics.convergence holds one run per seed: its curve (validation loss at
fixed sample counts), steps and samples to target, and whether it reached it. The
wall-clock of a point is its steps times the configuration's measured median step
time, so a layout that steps faster moves its curve left, never down.

Only the search's records are points (one per configuration): the confirmation rounds
and the ablation measure those configurations' step time again with the same steps.
Where the rounds ran (study.json's best_by_repeats, objective time_to_loss), the
headline's time and its rivals are theirs: medians over the repeated measurements.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from training_harness.core.units import format_seconds
from training_harness.records.tags import tags_of
from training_harness.reports.load import Run
from training_harness.reports.style import COLORS, REPEATS, Figure, esc, new_figure


@dataclass
class Point:
    """One configuration's time to target (a record with metrics.convergence)."""

    trial_id: str
    optimizer: str
    technique: str  # the optimizer and the maths-changing strategies, "adamw + curriculum"
    batch: int
    reached: bool
    steps: float | None
    samples: float | None
    time_s: float | None
    spread: tuple[float, float] | None
    best_loss: float
    seeds: int
    conv: dict[str, Any]


def points(run: Run) -> list[Point]:
    """One per configuration trained to the target; where the records train several
    workloads (a folder of bench runs), each technique is named with its workload."""
    out = []
    workloads = {}
    for tid, rec in run.records.items():
        conv = (rec.get("metrics") or {}).get("convergence")
        if (not isinstance(conv, dict) or not conv.get("runs")
                or tags_of(rec).get("phase") in REPEATS):
            continue
        spread = conv.get("time_spread_s")
        optimizer = str(conv.get("optimizer"))
        workloads[str(tid)] = _workload(rec)
        out.append(Point(str(tid), optimizer, str(conv.get("technique") or optimizer),
                         int(conv.get("global_batch") or 0),
                         bool(conv.get("reached")), conv.get("steps_to_target"),
                         conv.get("samples_to_target"), conv.get("time_to_target_s"),
                         tuple(spread) if spread else None, float(conv.get("best_val_loss")),
                         len(conv["runs"]), conv))
    if len(set(workloads.values())) > 1:
        out = [dataclasses.replace(p, technique=f"{workloads[p.trial_id]}: {p.technique}")
               for p in out]
    return out


def _workload(rec: dict[str, Any]) -> str:
    """The record's workload, short: an hf:/folder by its folder's name."""
    w = (rec.get("plan") or {}).get("workload")
    name = str((w.get("name") if isinstance(w, dict) else w) or "?")
    if name.startswith("hf:") and "/" in name:
        name = "hf:" + name.rstrip("/").rsplit("/", 1)[-1]
    return name


def tid(trial_id: str) -> str:
    """A trial as the page names it: #12 for a study's, the folder's name for a bench's."""
    return f"#{trial_id}" if trial_id.isdigit() else trial_id


def _label(p: Point) -> str:
    return f"{tid(p.trial_id)} {p.technique} batch {p.batch}"


def _curves(run: Run, wall: bool) -> Figure:
    key = "ttl_time" if wall else "ttl_samples"
    what = "wall-clock (steps × the configuration's step time)" if wall else "samples"
    title = f"Validation loss against {'wall-clock' if wall else 'samples'}"
    found = points(run)
    if not found:
        return Figure(key, title, None, empty="No trial trained to a target loss.")
    fig = new_figure(420, xaxis_title="seconds" if wall else "samples",
                     yaxis_title="validation loss", xaxis_type="log" if wall else "linear")
    for i, p in enumerate(sorted(found, key=lambda q: (q.technique, q.batch))):
        step_s = p.conv.get("step_time_s")
        if wall and not step_s:
            continue
        for j, r in enumerate(p.conv["runs"]):
            curve = [c for c in r.get("curve") or [] if c.get("step") or not wall]
            xs = [c["step"] * step_s if wall else c["samples"] for c in curve]
            fig.add_trace(go.Scatter(
                x=xs, y=[c["val_loss"] for c in curve], mode="lines+markers",
                name=_label(p), legendgroup=p.trial_id, showlegend=j == 0,
                line={"color": COLORS[i % len(COLORS)], "width": 1.5,
                      "dash": "solid" if p.technique == "adamw" else "dot"},
                hovertext=f"{_label(p)}, seed {r.get('seed')}", marker={"size": 4}))
    target = found[0].conv.get("target_loss")
    if target is not None:
        fig.add_hline(y=target, line={"color": "#222", "dash": "dash"},
                      annotation_text=f"target {target:g}")
    return Figure(key, title, fig, caption=(
        f"Held-out loss (eval mode, no gradients, the same samples each time) against {what}, "
        "one line per seed; plain AdamW solid, any other optimizer or technique dotted. A "
        "curve that stops above the dashed "
        "line missed the target within its cap."))


def loss_vs_samples(run: Run) -> Figure:
    return _curves(run, wall=False)


def loss_vs_time(run: Run) -> Figure:
    return _curves(run, wall=True)


def _cell(p: Point | None) -> str:
    if p is None:
        return "—"
    if not p.reached:
        return f"missed (best {p.best_loss:.3f})"
    text = f"{p.steps:g} steps, {p.samples:g} samples"
    if p.time_s is not None:
        text += f", {format_seconds(p.time_s)}"
        if p.spread and p.seeds > 1:
            text += f" [{format_seconds(p.spread[0])}–{format_seconds(p.spread[1])}]"
    return text


def steps_table(run: Run) -> str:
    """Rows: global batch; columns: technique (the optimizer and the maths-changing
    strategies beside it); each cell the fastest configuration's steps, samples and time
    to target (median over seeds, [min–max]), or the loss it reached."""
    found = points(run)
    if not found:
        return ""
    techniques = sorted({p.technique for p in found})
    best: dict[tuple[int, str], Point] = {}
    for p in found:
        k = (p.batch, p.technique)
        have = best.get(k)
        if have is None or (p.time_s or float("inf")) < (have.time_s or float("inf")):
            best[k] = p
    head = "".join(f"<th>{esc(o)}</th>" for o in techniques)
    rows = "".join(
        f"<tr><th>{b}</th>" + "".join(f"<td>{esc(_cell(best.get((b, o))))}</td>"
                                      for o in techniques) + "</tr>"
        for b in sorted({p.batch for p in found}))
    return f"<table><tr><th>global batch</th>{head}</tr>{rows}</table>"


def fastest(run: Run) -> tuple[Point | None, str]:
    """The configuration with the least time to target, and whether the next one is
    within its spread over seeds (then the two are not told apart)."""
    hits = sorted((p for p in points(run) if p.reached and p.time_s is not None),
                  key=lambda p: p.time_s)
    if not hits:
        return None, "no configuration reached the target"
    confirmed = _confirmed(run, hits)
    if confirmed:
        return confirmed
    first = hits[0]
    if len(hits) == 1:
        return first, ""
    second = hits[1]
    _, hi1 = first.spread or (first.time_s, first.time_s)
    lo2, _ = second.spread or (second.time_s, second.time_s)
    if lo2 <= hi1:
        return first, (f"{tid(second.trial_id)} ({second.technique}, batch {second.batch}, "
                       f"{format_seconds(second.time_s)}) is within the spread over seeds: "
                       "the two are not told apart")
    return first, f"ahead of the next ({tid(second.trial_id)}) beyond the spread over seeds"


def ranks_by_time(run: Run) -> bool:
    """The study's objective is time to a target loss (not throughput beside it)."""
    obj = run.study.get("objective")
    objectives = obj if isinstance(obj, list) else [obj]
    return "time_to_loss" in objectives and "throughput" not in objectives


def _confirmed(run: Run, hits: list[Point]) -> tuple[Point, str] | None:
    """The best the confirmation rounds of a time-to-loss study named, if they ran
    (study.json's best_by_repeats), at its median time to target over them."""
    d = run.study.get("best_by_repeats")
    by_id = {p.trial_id: p for p in hits}
    if (not isinstance(d, dict) or d.get("objective") != "time_to_loss"
            or str(d.get("best")) not in by_id):
        return None
    best = by_id[str(d["best"])]
    best = dataclasses.replace(best, time_s=d["median"])
    close = [f"#{i}" for i in d.get("indistinguishable") or []]
    note = (f"median over {d['n']} measurements of its step time; "
            + (f"{', '.join(close)} within the spread of the measurements and seeds: not told "
               "apart" if close else "ahead of the other contenders beyond the spread of the "
               "measurements and seeds"))
    return best, note


def speedup(run: Run, best_id: str, base_id: str) -> tuple[float, str] | None:
    """A time-to-loss study's speedup from one measurement each: the fp32 baseline's time
    to target over the best's (the rounds' medians are reports.headline's)."""
    times = [((run.records.get(i) or {}).get("metrics") or {}).get("time_to_target_s")
             for i in (best_id, base_id)]
    if not all(times):
        return None
    return times[1] / times[0], "time to target, one measurement each"
