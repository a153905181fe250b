"""The study's end, written by its main worker: study.json, best.toml, and the summary printed."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import optuna

from training_harness.records.predicates import busy_note
from training_harness.records.run_store import RunStore
from training_harness.records.tags import tags_of
from training_harness.records.verdict import HELD, StudyVerdict, study_verdict
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock
from training_harness.tune.final.confirmation import refreshed
from training_harness.tune.final.summary import (
    ablation_table,
    confirmation_text,
    now,
    status_counts,
    table,
    tf32_line,
    variants_table,
    verdict_text,
    write_best,
)
from training_harness.tune.final.variants import VARIANTS_KEY
from training_harness.tune.model.correction import Corrections
from training_harness.tune.storage import StorageUnreachable
from training_harness.tune.study_trials import BEST_BY_REPEATS, StudyTrials


def confirmed_decision(optuna_study: optuna.Study, best_id: Any) -> dict[str, Any] | None:
    """The confirmation's decision, when it named the trial that is the best now."""
    decision = _user_attr(optuna_study, BEST_BY_REPEATS)
    return decision if decision and str(decision["best"]) == str(best_id) else None


def _user_attr(optuna_study: optuna.Study, key: str) -> Any:
    try:
        return optuna_study.user_attrs.get(key)
    except StorageUnreachable:
        return None


def write_results(study: Study, store: RunStore, clock: Clock, trials: StudyTrials,
                  corrections: Corrections, budget_bytes: float, stopped: str,
                  spent: dict[str, float] | None = None) -> bool:
    """Write study.json (and best.toml), print the summary; False when nothing ran ok."""
    records = store.records()
    try:
        best = trials.best_trial()
    except StorageUnreachable:
        best = None  # the records are all there is; --resume finishes the study
    best_id = best.user_attrs.get("trial_id", best.number) if best else None
    baseline = next((r for r in records if tags_of(r).get("phase") == "baseline"), None)
    decision = confirmed_decision(trials.optuna_study, best_id)
    # one figure per configuration, and the ratios with their intervals (throughput)
    verdict = (study_verdict(records, best_id, baseline and baseline["trial_id"])
               if "throughput" in study.objectives else None)
    rate = None
    if best is not None:
        if "throughput" in study.objectives:
            rate = best.values[study.objectives.index("throughput")]
            rate = decision["median"] if decision else rate
            rate = verdict.best.median if verdict and verdict.best else rate
        write_best(store, study.name, best_id, best.user_attrs["plan"], rate,
                   *_best_comment(verdict, "throughput" in study.objectives))
    store.update_info(
        finished_at=now(), best_trial_id=best_id,
        baseline_trial_id=baseline["trial_id"] if baseline else None,
        n_trials=len(records), stopped_because=stopped,
        wall_clock_s=round(clock.elapsed(), 1),
        calibration=corrections().as_dict(),  # study.json's key
        best_by_repeats=decision,
        verdict=verdict.as_dict() if verdict else None,  # training_harness.records.verdict
        variants=_user_attr(trials.optuna_study, VARIANTS_KEY),
        time_spent={k: round(v, 1) for k, v in (spent or {}).items()},
    )
    multi = len(study.objectives) > 1
    print(f"\nstudy {study.name}: {len(records)} trials ({status_counts(records)}) in "
          f"{clock.elapsed():.0f} s of a {clock.budget_s:.0f} s budget; stopped: {stopped}")
    print(table(records, multi, memory_budget=budget_bytes, best_id=best_id))
    if spent:
        parts = [f"{name} {v:.0f} s" for name, v in spent.items()]
        unused = max(clock.left(), 0.0)
        print(f"time: {', '.join(parts)}; {unused:.0f} s of the budget unused")
    if verdict and (said := verdict_text(verdict)):
        print(said)
    if decision:  # its figures with the ablation's measurements pooled in
        print(confirmation_text(_agreeing(refreshed(decision, records), verdict)))
    else:
        base_rate = baseline and (baseline.get("metrics") or {}).get("samples_per_s")
        r = verdict.versus_baseline if verdict else None
        if r is not None and verdict is not None and verdict.best is not None:
            print(f"best: trial {best_id}, {verdict.best.text()}, {r.estimate:.2f}x the strict "
                  f"fp32 baseline (TF32 off; trial {baseline['trial_id']}; {r.interval}, "
                  f"{r.basis}): {verdict.said}")
        elif rate and base_rate:
            print(f"best: trial {best_id}, {rate / base_rate:.2f}x the strict fp32 baseline "
                  f"(TF32 off; trial {baseline['trial_id']}; one measurement each)")
    over_tf32 = tf32_line(records, baseline, (decision or {}).get("median") or rate,
                          verdict.best if verdict else None)
    if over_tf32 and (decision or {}).get("objective") != "time_to_loss":
        print(over_tf32)
    if best_id is not None:
        for text in (ablation_table(records, best_id), variants_table(records, rate)):
            if text:
                print(text)
        print(f"wrote {store.best_toml}; re-run it: harness bench {store.best_toml}")
    else:
        busy = [r for r in records if r["status"] == "ok" and busy_note(r)]
        if busy:
            print(f"{len(busy)} configuration(s) ran, each measured while other processes "
                  f"used the machine ({busy_note(busy[-1])}), so none is named best: run the "
                  "study on a quiet machine, or set HARNESS_QUIET_SHARE=1 to accept busy "
                  "figures (they stay marked in the records)", file=sys.stderr)
        print("no configuration ran within the budgets; nothing to write to best.toml "
              "(each record's reason says why)", file=sys.stderr)
    print(f"records: {store.trials_jsonl}")
    print(f"look at it: harness report {shlex.quote(str(store.root))}  (one HTML page: the best "
          "against the baseline, what each technique bought, every trial)")
    return best_id is not None


def _best_comment(verdict: StudyVerdict | None, throughput: bool) -> tuple[Any, str]:
    """best.toml's figure (the pooled one) and its ratio over the baseline, in words."""
    if verdict is None or not throughput:
        return None, ""
    r = verdict.versus_baseline
    against = (f"{r.estimate:.2f}x ({r.interval}, {r.basis}): {verdict.said}"
               + (" (held back: no technique is beyond the noise)" if verdict.held_back
                  else "") if r else "")
    return verdict.best, against


def _agreeing(decision: dict[str, Any], verdict: StudyVerdict | None) -> dict[str, Any]:
    """The decision as the summary prints it: where the study's verdict held the lead
    back (no technique beyond the noise), its ratio over the baseline says so too."""
    vs = decision.get("versus_baseline")
    if not vs or verdict is None or not verdict.held_back:
        return decision
    return {**decision, "versus_baseline": {
        **vs, "verdict": f"{HELD} (held back: the ablation finds no technique beyond the "
                         "noise alone)"}}
