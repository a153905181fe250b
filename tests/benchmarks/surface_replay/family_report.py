"""The family replay's tables (markdown) from its JSON lines (family_run.py), and issue
34's three goals checked on each surface:

    no miss     the harness's search reached 0.97 of the best on every seed within the
                study's budget (a search that stopped itself short of it, or ran out of
                budget, missed)
    1 h         its best-so-far at 1 simulated hour is >= 0.95 of the best (median over seeds)
    1/5         its median cost to 0.97 is <= 1/5 of random search's median cost
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

HOUR = 3600.0
INF = float("inf")
GOAL_1H, GOAL_RATIO = 0.95, 0.2


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Lines of every file; a surface twice (same space, surface, seeds): the last one."""
    lines: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            if text.strip():
                r = json.loads(text)
                lines[(r["space"], r["surface"], r["seeds"])] = r
    return list(lines.values())


def costs(runs: list[dict[str, Any]]) -> list[float]:
    return [INF if r["reached_s"] is None else r["reached_s"] for r in runs]


def judge(line: dict[str, Any]) -> dict[str, Any]:
    """One surface's figures and goals."""
    h, rnd, est = (line["runs"][k] for k in ("harness", "random", "estimator"))
    hc, rc, ec = costs(h), costs(rnd), costs(est)
    med, rmed = statistics.median(hc), statistics.median(rc)
    ratio = med / rmed if rmed not in (0, INF) else INF
    share = statistics.median(r["share_1h"] for r in h)
    missed = [r for r in h if r["reached_s"] is None]
    misses = len(missed)
    return {
        "surface": line["surface"], "space": line["space"], "assumes": line["assumes"],
        "seeds": line["seeds"], "near": line["near"], "configurations": line["configurations"],
        "median": med, "worst": max(hc), "misses": misses, "share_1h": share,
        "random_median": rmed, "random_share_1h": statistics.median(r["share_1h"] for r in rnd),
        "ratio": ratio, "estimator_median": statistics.median(ec),
        "estimator_misses": sum(c == INF for c in ec),
        "launched": statistics.median(r["launched"] for r in h),
        "miss_stops": Counter(r["stopped"].split(":")[0] for r in missed),
        "miss_hours": [r["elapsed_s"] / HOUR for r in missed],
        "goal_miss": misses == 0, "goal_1h": share >= GOAL_1H, "goal_ratio": ratio <= GOAL_RATIO,
        "wall_s": line["wall_s"], "cpu_s": line.get("cpu_s"), "tree": line.get("tree"),
        "budget_h": line["budget_s"] / HOUR,
    }


def _h(seconds: float) -> str:
    return "missed" if seconds == INF else f"{seconds / HOUR:.2f}"


def _mark(ok: bool) -> str:
    return "yes" if ok else "**no**"


def surface_table(judged: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| surface | within 0.97 | harness median (h) | worst (h) | missed | share at 1 h "
        "(median) | random median (h) | harness / random | estimator median (h), missed "
        "| no miss | >= 0.95 at 1 h | <= 1/5 of random |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for j in judged:
        ratio = "-" if j["ratio"] == INF else f"{j['ratio']:.2f}"
        lines.append(
            f"| {j['surface']} | {j['near']} | {_h(j['median'])} | {_h(j['worst'])} | "
            f"{j['misses']} of {j['seeds']} | {j['share_1h']:.3f} | {_h(j['random_median'])} | "
            f"{ratio} | {_h(j['estimator_median'])}, {j['estimator_misses']} | "
            f"{_mark(j['goal_miss'])} | {_mark(j['goal_1h'])} | {_mark(j['goal_ratio'])} |")
    return lines


def across(judged: list[dict[str, Any]]) -> list[str]:
    """The family as a whole: pooled over every (surface, seed) and per surface."""
    n = len(judged)
    seeds = sum(j["seeds"] for j in judged)
    finite = [j["median"] for j in judged]
    ratios = [j["ratio"] for j in judged]
    return [
        "| surfaces | runs | missed (surfaces with a miss) | median of the surfaces' median "
        "cost (h) | worst surface's median (h) | worst single run (h) | share at 1 h: median "
        "of surfaces (lowest) | harness / random: median of surfaces (highest) | goals met: "
        "no miss / 1 h / 1/5 / all three |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {n} | {seeds} | {sum(j['misses'] for j in judged)} "
        f"({sum(j['misses'] > 0 for j in judged)}) | {_h(statistics.median(finite))} | "
        f"{_h(max(finite))} | {_h(max(j['worst'] for j in judged))} | "
        f"{statistics.median(j['share_1h'] for j in judged):.3f} "
        f"({min(j['share_1h'] for j in judged):.3f}) | "
        f"{_ratio(statistics.median(ratios))} ({_ratio(max(ratios))}) | "
        f"{sum(j['goal_miss'] for j in judged)} / {sum(j['goal_1h'] for j in judged)} / "
        f"{sum(j['goal_ratio'] for j in judged)} / "
        f"{sum(j['goal_miss'] and j['goal_1h'] and j['goal_ratio'] for j in judged)} of {n} |"]


def _ratio(x: float) -> str:
    return "inf (missed)" if x == INF else f"{x:.2f}"


def misses_said(judged: list[dict[str, Any]]) -> list[str]:
    out = []
    for j in judged:
        if j["misses"]:
            hours = ", ".join(f"{x:.1f}" for x in sorted(j["miss_hours"]))
            out.append(f"- {j['surface']}: the search ended by "
                       + ", ".join(f"{k} ({v})" for k, v in j["miss_stops"].items())
                       + f" at {hours} simulated h of a {j['budget_h']:g} h budget.")
    return out


def report(paths: list[Path]) -> str:
    lines: list[str] = []
    by_space: dict[str, list[dict[str, Any]]] = {}
    for line in load(paths):
        by_space.setdefault(line["space"], []).append(judge(line))
    for space, judged in by_space.items():
        trees = sorted({j["tree"] for j in judged if j["tree"]})
        cpu = sum(j["cpu_s"] or 0 for j in judged)
        lines += [f"### {space}: {len(judged)} surfaces, {judged[0]['configurations']:,} "
                  f"configurations, {judged[0]['seeds']} seeds each, budget "
                  f"{judged[0]['budget_h']:g} h", "",
                  f"harness/ at {', '.join(trees) or 'unknown'}. Replay CPU time "
                  f"{cpu / 60:.1f} min (wall {sum(j['wall_s'] for j in judged) / 60:.1f} min "
                  "summed over surfaces).", "", "Across the family:", ""]
        lines += across(judged) + ["", "Per surface:", ""] + surface_table(judged)
        said = misses_said(judged)
        if said:
            lines += ["", "Where the harness missed:", ""] + said
        lines.append("")
    return "\n".join(lines)
