"""Leave-one-out trials of the best configuration: what did each technique buy?

At the end of a study the best configuration is run again with each of its
techniques turned off in turn, everything else fixed, and itself, each `repeats`
times (so the spread between repeats shows which differences are real). The
order is round by round (best, without A, without B, ...; then again), so a
study whose time runs out still has every configuration at least once.

Only techniques the search turned on are left out: the data-parallel wrapper,
pipeline and tensor parallel follow from the layout, and accumulation from the
micro-batch size. Each record is tagged

    {"phase": "ablation", "ablation": {"of": <best trial_id>,
     "without": <strategy or None for the best itself>, "repeat": i}}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.records.result import read_result
from harness.study.search_space import SearchSpace
from harness.tune.sampling import frozen, outcome
from harness.tune.trial_job import run_trial_job

if TYPE_CHECKING:
    from harness.tune.tuner import Tuner


@dataclass
class AblationJob:
    trial_id: str
    params: dict[str, Any]
    of: int | str
    without: str | None
    repeat: int

    @property
    def tags(self) -> dict[str, Any]:
        return {"phase": "ablation",
                "ablation": {"of": self.of, "without": self.without, "repeat": self.repeat}}


def techniques(space: SearchSpace, params: dict[str, Any]) -> list[str]:
    """The searched techniques turned on in `params`."""
    return [name for name in space.optional if params.get(name) is True]


def ablation_jobs(space: SearchSpace, best_params: dict[str, Any], best_id: int | str,
                  repeats: int) -> list[AblationJob]:
    jobs = []
    for repeat in range(repeats):
        for without in [None, *techniques(space, best_params)]:
            params = dict(best_params)
            if without is not None:
                params[without] = False
                params = {k: v for k, v in params.items() if not k.startswith(f"{without}.")}
            trial_id = f"ablation-{best_id}-{without or 'best'}-{repeat}"
            jobs.append(AblationJob(trial_id, params, best_id, without, repeat))
    return jobs


def run_ablation(tuner: Tuner) -> str:
    """Run the ablation of the best trial so far; returns how it ended, in words.

    Each trial is added to Optuna as it finished (study.add_trial: nobody else can
    pick it up), then recorded. On --resume a trial already recorded is not run
    again; one that never finished (not started for lack of time, or stopped at
    the deadline) runs again under a new id, `<id>-retry<k>`.
    """
    best = tuner.best_trial()
    repeats = tuner.study.budget.ablation_repeats
    if best is None or not repeats:
        return "no feasible trial to ablate" if best is None else "ablation off"
    best_id = best.user_attrs.get("trial_id", best.number)
    store = tuner.run.store
    recorded = {str(r["trial_id"]): r for r in store.records()}
    for job in ablation_jobs(tuner.space, best.params, best_id, repeats):
        tries = [i for i in recorded if i == job.trial_id or i.startswith(f"{job.trial_id}-retry")]
        if any(_finished(recorded[i]) for i in tries):
            continue
        if not tries and _recover(tuner, job.trial_id):
            continue
        if tries:
            job.trial_id = f"{job.trial_id}-retry{len(tries)}"
        if tuner.clock.left() <= 0:
            return "time: the deadline came before every ablation trial ran"
        plan = tuner.space.plan(job.params)
        tuner.on_event("start", {"trial_id": job.trial_id, "plan": plan.to_dict(),
                                 "phase": "ablation", "duplicate": False})
        result = run_trial_job(tuner.run, job.trial_id, plan, job.tags, tuner.calibration(),
                               tuner.clock.deadline)
        used = tuner.space.distributions(job.params)
        attrs = {"phase": "ablation", "trial_id": job.trial_id, "status": result.status,
                 "plan": result.plan, "worker": tuner.me.tag}
        got = outcome(result.to_dict(), tuner.study.objectives, tuner.run.budget_bytes)
        tuner.optuna_study.add_trial(frozen(got, {k: job.params[k] for k in used}, used, attrs))
        result.tags["optuna_number"] = _number_of(tuner, job.trial_id)
        result.write(store.trial_dir(job.trial_id) / "result.json")
        store.append(result)
        tuner.on_event("end", result.to_dict())
        if not _finished(result.to_dict()):
            return f"time: {result.reason}"
    return "done"


def _finished(record: dict[str, Any]) -> bool:
    tags = record.get("tags") or {}
    return tags.get("pruned") != "time" and not tags.get("deadline")


def _number_of(tuner: Tuner, trial_id: str) -> int | None:
    for t in reversed(tuner.optuna_study.get_trials(deepcopy=False)):
        if t.user_attrs.get("trial_id") == trial_id:
            return t.number
    return None


def _recover(tuner: Tuner, trial_id: str) -> bool:
    """A finished ablation trial that reached Optuna but not trials.jsonl: record it."""
    number = _number_of(tuner, trial_id)
    path = tuner.run.store.trial_dir(trial_id) / "result.json"
    if number is None or not path.exists():
        return False
    result = read_result(path)
    result.tags["optuna_number"] = number
    tuner.run.store.append(result)
    return True


def summarize(records: list[dict[str, Any]], of: int | str) -> list[dict[str, Any]]:
    """Per configuration of the ablation of `of`: throughput median, min, max, n."""
    rows: dict[str | None, list[float]] = {}
    statuses: dict[str | None, list[str]] = {}
    for r in records:
        tag = (r.get("tags") or {}).get("ablation") or {}
        if str(tag.get("of")) != str(of):
            continue
        key = tag.get("without")
        statuses.setdefault(key, []).append(r["status"])
        rate = (r.get("metrics") or {}).get("samples_per_s")
        if r["status"] == "ok" and rate:
            rows.setdefault(key, []).append(rate)
    out = []
    for key, st in statuses.items():
        rates = rows.get(key, [])
        out.append({
            "without": key,
            "n": len(rates),
            "statuses": st,
            "median": statistics.median(rates) if rates else None,
            "min": min(rates) if rates else None,
            "max": max(rates) if rates else None,
        })
    out.sort(key=lambda row: (row["without"] is not None, str(row["without"])))
    return out
