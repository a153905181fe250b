"""The headline of a study: its best configuration against its own strict fp32 baseline
(TF32 off), and against fp32+TF32 (the baseline plus [strategies.tf32]) where measured.

Honest by construction: the speedup is the best's configuration over the baseline's,
each every quiet measurement of it in the study pooled, with its interval and verdict
(training_harness.records.verdict, the same object the tuner's summary and the ablation table
read); where either is missing or did not finish, `missing` says so in words and no
number is made up.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import pandas as pd

from training_harness.records.verdict import StudyVerdict, study_verdict
from training_harness.reports import figures_convergence as fc
from training_harness.reports.load import Run
from training_harness.reports.style import num


@dataclass
class Headline:
    best: pd.Series | None
    baseline: pd.Series | None
    speedup: float | None = None
    memory_ratio: float | None = None      # best peak / baseline peak
    missing: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    command: str = ""
    best_toml_command: str = ""
    repeats: list[float] = field(default_factory=list)  # best re-measured (ablation)
    basis: str = "one measurement each"  # what the speedup's two figures are
    tf32_speedup: float | None = None  # best samples/s over the fp32+TF32 trial's
    tf32_id: str | None = None
    tf32_text: str = "one measurement each"  # what the fp32+TF32 ratio rests on
    study: StudyVerdict | None = None  # the pooled figures, intervals and verdicts

    @property
    def verdict(self) -> str:
        n = sum(self.counts.values())
        ok = self.counts.get("ok", 0)
        if n == 0:
            return "This study has no trial records yet."
        if ok == 0:
            parts = ", ".join(f"{c} {s}" for s, c in sorted(self.counts.items()))
            return f"No trial finished: all {n} trial(s) are failed or pruned ({parts})."
        if n == 1:
            return "A study of one trial: there is nothing to compare it with."
        if self.speedup is not None:
            over = (f" It trains {self.tf32_speedup:.2f}× as fast as fp32+TF32 (trial "
                    f"{self.tf32_id}, {self.tf32_text})." if self.tf32_speedup else "")
            said = self.study.headline() if self.study is not None else ""
            if said:
                return said + over
            return (f"The best configuration trains {self.speedup:.2f}× as fast as the strict "
                    f"fp32 baseline of this study (TF32 off; {self.basis}).{over}")
        return "The best configuration is shown below. " + " ".join(self.missing)


def headline(run: Run) -> Headline:
    t = run.trials
    counts = t["status"].value_counts().to_dict()
    h = Headline(run.row(run.best_id), run.row(run.baseline_id), counts={
        str(k): int(v) for k, v in counts.items()})
    b, base = h.best, h.baseline
    if b is not None:
        h.command = b["command"]
        if (run.path / "best.toml").is_file():
            h.best_toml_command = f"harness bench {shlex.quote(str(run.path / 'best.toml'))}"
        abl = t[(t["phase"] == "ablation") & t["ablation_without"].isna()
                & (t["status"] == "ok")]
        h.repeats = [x for x in map(num, abl["samples_per_s"]) if x is not None]
    if base is None:
        h.missing.append("There is no fp32 baseline trial in this study, so no speedup is "
                         "given.")
    elif base["status"] != "ok" or not num(base["samples_per_s"]):
        h.missing.append(f"The fp32 baseline (trial {base['trial_id']}) did not finish "
                         f"({base['status']}: {base['reason_short'] or 'no reason recorded'}), "
                         "so no speedup is given.")
    elif b is not None and b["trial_id"] == base["trial_id"]:
        h.missing.append("The best configuration is the fp32 baseline itself: no technique "
                         "beat it here.")
    elif b is not None:
        h.speedup = b["samples_per_s"] / base["samples_per_s"]
        if fc.ranks_by_time(run):  # a study of time to a target loss: how much sooner
            repeats = _by_repeats(run, b, base) or fc.speedup(
                run, str(b["trial_id"]), str(base["trial_id"]))
            if repeats:
                h.speedup, h.basis = repeats
        else:  # every measurement of each configuration pooled, with its interval
            h.study = study_verdict(list(run.records.values()), b["trial_id"],
                                    base["trial_id"])
            r = h.study.versus_baseline
            if r is not None:
                h.speedup, h.basis = r.estimate, f"{r.interval}, {r.basis}: {h.study.said}"
        ref = _tf32_reference(t, base)
        if ref is not None and num(b["samples_per_s"]):
            h.tf32_speedup = b["samples_per_s"] / ref["samples_per_s"]
            h.tf32_id = str(ref["trial_id"])
            if h.study is not None and h.study.best is not None:
                r = _versus(run, h.study, str(ref["trial_id"]))
                if r is not None:
                    h.tf32_speedup, h.tf32_text = r.estimate, f"{r.interval}, {r.basis}"
        if num(base["peak_memory_bytes"]) and num(b["peak_memory_bytes"]) is not None:
            h.memory_ratio = b["peak_memory_bytes"] / base["peak_memory_bytes"]
    if b is None and counts.get("ok"):
        h.missing.append("No trial fits the memory budget, so there is no best configuration.")
    return h


def _tf32_reference(t: pd.DataFrame, base: pd.Series) -> pd.Series | None:
    """The finished fp32+TF32 trial: the baseline's strategies plus tf32, its layout and
    micro-batch; None when the study measured none."""
    want = " + ".join(sorted({*base["strategies"].split(" + "), "tf32"} - {"none"}))
    rows = t[(t["strategies"] == want) & (t["status"] == "ok")
             & (t["layout"] == base["layout"])
             & (t["micro_batch_size"] == base["micro_batch_size"])]
    rows = rows[[bool(num(x)) for x in rows["samples_per_s"]]]
    return rows.iloc[0] if len(rows) else None


def _by_repeats(run: Run, best: pd.Series, base: pd.Series) -> tuple[float, str] | None:
    """The speedup as the confirmation rounds measured it
    (training_harness.tune.final.confirmation): the
    best's median over the baseline's (throughput), or the baseline's time to target over
    the best's (time_to_loss), when study.json's decision names both."""
    d = run.study.get("best_by_repeats") or {}
    b, ref = d.get("median"), (d.get("baseline") or {}).get("median")
    if (not b or not ref or str(d.get("best")) != str(best["trial_id"])
            or str(d.get("baseline_id")) != str(base["trial_id"])):
        return None
    timed = d.get("objective") == "time_to_loss"
    close = d.get("indistinguishable") or []
    text = (f"{'time to target: ' if timed else ''}medians over {d['n']} and "
            f"{d['baseline']['n']} measurements, taken in interleaved rounds")
    if close:
        text += (f"; trial(s) {', '.join(map(str, close))} could not be told apart from it "
                 "here")
    if d.get("baseline_within_spread"):
        text += ("; its lead over the baseline is within the spread of those measurements"
                 + (" and seeds" if timed else ""))
    return (ref / b if timed else b / ref), text


def _versus(run: Run, v: StudyVerdict, trial_id: str):
    """The best's pool over trial `trial_id`'s configuration's pool (a Ratio), or None."""
    from training_harness.records.pooled import compare, pool_of

    other = pool_of(list(run.records.values()), trial_id)
    return compare(v.best, other) if other is not None and v.best is not None else None
