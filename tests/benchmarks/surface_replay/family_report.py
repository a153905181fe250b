"""The family replay's tables (markdown) from its JSON lines (family_run.py), and issue
34's three goals checked on each surface:

    no miss     the harness's search reached 0.97 of the best on every seed within the
                study's budget (a search that stopped itself short of it, or ran out of
                budget, missed)
    1 h         its best-so-far at 1 simulated hour is >= 0.95 of the best (median over seeds)
    1/5         its median cost to 0.97 is <= 1/5 of random search's median cost

and, where lines hold Optuna's samplers' runs (family_run's `samplers`), issue 55's two:

    1/2         the harness's median cost to 0.97 is <= 1/2 of the best sampler's (the one
                of lowest median cost; a sampler that missed most seeds has none)
    no miss     as above

A sampler's run censored at a horizon (family_run's `horizon_s`: stopped short of 0.97 for
the replay's CPU) costs more than the horizon: its median and p90 read "> H" where
censored, and the 1/2 goal is judged against the horizon, a lower bound (so it may read
not met where the full run would meet it, never the other way).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

HOUR = 3600.0
INF = float("inf")
GOAL_1H, GOAL_RATIO, GOAL_SAMPLERS = 0.95, 0.2, 0.5
SAMPLERS = {"tpe": "TPE", "gp": "GPSampler", "botorch": "BoTorch"}


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Lines of every file; a surface twice (same space, surface, seeds): the last one,
    with the arms of the earlier ones it lacks (a sampler replayed in a file of its own)."""
    lines: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            if text.strip():
                r = json.loads(text)
                k = (r["space"], r["surface"], r["seeds"])
                earlier = lines.get(k, {}).get("runs", {})
                lines[k] = {**r, "runs": {**earlier, **r["runs"]}}
    return list(lines.values())


def costs(runs: list[dict[str, Any]]) -> list[float]:
    return [INF if r["reached_s"] is None else r["reached_s"] for r in runs]


def p90(values: list[float]) -> float:
    ordered = sorted(values)  # as search_replay.py's table replay takes it
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def most_seeds(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (space, surface), the line of the most seeds."""
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for line in lines:
        k = (line["space"], line["surface"])
        if k not in kept or line["seeds"] > kept[k]["seeds"]:
            kept[k] = line
    return list(kept.values())


def arms_of(lines: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, list]]:
    """Per (space, surface), each arm's runs from the line of the most seeds that holds
    it (a sampler replayed with fewer seeds, in a file of its own, joins the harness's)."""
    out: dict[tuple[str, str], dict[str, list]] = {}
    for line in lines:
        arms = out.setdefault((line["space"], line["surface"]), {})
        for arm, runs in line["runs"].items():
            if len(runs) > len(arms.get(arm, [])):
                arms[arm] = runs
    return out


def floors(runs: list[dict[str, Any]]) -> list[float]:
    """Each run's cost, or its lower bound where censored: the horizon."""
    return [r.get("censored_s") or INF if r["reached_s"] is None else r["reached_s"]
            for r in runs]


def _figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    low = floors(runs)
    censored = sum(r.get("censored_s") is not None for r in runs)
    return {"median": statistics.median(low), "p90": p90(low), "seeds": len(runs),
            "misses": sum(c == INF for c in low), "censored": censored, "costs": low,
            "cut": [r.get("censored_s") is not None for r in runs],
            "median_censored": statistics.median(costs(runs)) != statistics.median(low),
            "p90_censored": p90(costs(runs)) != p90(low)}


def judge_samplers(surface: str, arms: dict[str, list]) -> dict[str, Any] | None:
    """The harness against Optuna's samplers on one surface; None where none ran."""
    ran = [n for n in SAMPLERS if n in arms]
    if not ran or "harness" not in arms:
        return None
    figures = {n: _figures(arms[n]) for n in ("harness", *ran)}
    best = min(ran, key=lambda n: (figures[n]["median"], figures[n]["misses"]))
    h, b = figures["harness"]["median"], figures[best]["median"]
    ratio = 0.0 if b == INF and h < INF else (h / b if b not in (0, INF) else INF)
    return {"surface": surface, "figures": figures, "best": best, "ratio": ratio,
            "goal_half": ratio <= GOAL_SAMPLERS, "goal_miss": figures["harness"]["misses"] == 0,
            "stops": [r["stopped"] for r in arms["harness"]]}


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


def _cell(f: dict[str, Any]) -> str:
    censored = f", {f['censored']} censored" if f["censored"] else ""
    return (f"{'> ' * f['median_censored']}{_h(f['median'])}, "
            f"{'> ' * f['p90_censored']}{_h(f['p90'])}, {f['misses']} of {f['seeds']}"
            f"{censored}")


def samplers_table(judged: list[dict[str, Any]]) -> list[str]:
    ran = [n for n in SAMPLERS if any(n in j["figures"] for j in judged)]
    lines = ["| surface | harness | " + " | ".join(SAMPLERS[n] for n in ran)
             + " | best sampler | harness / best | <= 1/2 | no miss |",
             "| --- " * (len(ran) + 6) + "|"]
    for j in judged:
        f = j["figures"]
        ratio = ("-" if j["ratio"] == INF else "its median missed" if
                 f[j["best"]]["median"] == INF else
                 f"{'< ' * f[j['best']]['median_censored']}{j['ratio']:.2f}")
        lines.append(f"| {j['surface']} | {_cell(f['harness'])} | "
                     + " | ".join(_cell(f[n]) if n in f else "not run" for n in ran)
                     + f" | {SAMPLERS[j['best']]} | {ratio} | {_mark(j['goal_half'])} | "
                     f"{_mark(j['goal_miss'])} |")
    return lines


def _by_seed(f: dict[str, Any]) -> str:
    return ", ".join("> " * cut + _h(c) for c, cut in zip(f["costs"], f["cut"], strict=True))


def samplers_traces(judged: list[dict[str, Any]]) -> list[str]:
    """Where a goal fails: every seed's cost, the harness's and the best sampler's."""
    out = []
    for j in judged:
        if j["goal_half"] and j["goal_miss"]:
            continue
        f = j["figures"]
        out.append(f"- {j['surface']}: harness {_by_seed(f['harness'])} h by seed (its "
                   f"searches ended: {'; '.join(sorted(set(j['stops'])))}); "
                   f"{SAMPLERS[j['best']]} {_by_seed(f[j['best']])} h.")
    return out


def samplers_section(lines: list[dict[str, Any]]) -> list[str]:
    """Issue 55's table: the harness against Optuna's samplers, per surface."""
    out: list[str] = []
    by_space: dict[str, list[dict[str, Any]]] = {}
    for (space, surface), arms in arms_of(lines).items():
        j = judge_samplers(surface, arms)
        if j is not None:
            by_space.setdefault(space, []).append(j)
    for space, judged in by_space.items():
        out += [f"### {space}: the harness against Optuna's samplers", "",
                "Cost to 0.97 of the best, simulated hours: median, p90, missed of seeds.",
                "", *samplers_table(judged), "",
                f"Goals met: 1/2 of the best sampler on {sum(j['goal_half'] for j in judged)} "
                f"of {len(judged)} surfaces, no miss on {sum(j['goal_miss'] for j in judged)} "
                f"of {len(judged)}."]
        traces = samplers_traces(judged)
        if traces:
            out += ["", "Where a goal is not met:", "", *traces]
        out.append("")
    return out


def report(paths: list[Path]) -> str:
    lines: list[str] = []
    by_space: dict[str, list[dict[str, Any]]] = {}
    every = load(paths)
    for line in most_seeds(every):
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
    return "\n".join(lines + samplers_section(every))
