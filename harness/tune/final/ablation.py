"""Leave-one-out trials of the best configuration: what did each technique buy?

At the end of a study the best configuration is run again with each of its
techniques turned off in turn, everything else fixed, and itself, each `repeats`
times. The order is round by round (best, without A, without B, ...; then again),
so a study whose time runs out still has every configuration at least once, and
each repeat's measurements are pairs taken close together. What a technique bought
is judged on every measurement of each configuration, pooled across the study's
phases, with an interval (training_harness.records.verdict): the configuration without a
technique may be one the study measured before (the baseline's, for a best with one
technique), and then it is the very comparison the headline makes.

Only techniques the search turned on are left out: the data-parallel wrapper,
pipeline and tensor parallel follow from the layout, and accumulation from the
micro-batch size. Each record is tagged

    {"phase": "ablation", "ablation": {"of": <best trial_id>,
     "without": <strategy or None for the best itself>, "repeat": i}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial

from training_harness.records.predicates import finished
from training_harness.records.run_store import RunStore
from training_harness.records.tags import tags_of
from training_harness.study.search_space import SearchSpace
from training_harness.tune.budget import Clock
from training_harness.tune.final.extra_trial import ExtraTrials, attempt_id


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


def run_ablation(best: FrozenTrial | None, space: SearchSpace, repeats: int,
                 store: RunStore, clock: Clock, extra: ExtraTrials) -> str:
    """Run the ablation of `best` (the best trial so far), `repeats` rounds; returns how
    it ended, in words.

    Each trial runs as training_harness.tune.final.extra_trial runs it (recorded, then Optuna
    told; on --resume, one that never finished runs again as `<id>-retry<k>`).
    """
    if best is None or not repeats:
        return "no feasible trial to ablate" if best is None else "ablation off"
    best_id = best.user_attrs.get("trial_id", best.number)
    recorded = {str(r["trial_id"]): r for r in store.records()}
    for job in ablation_jobs(space, best.params, best_id, repeats):
        trial_id = attempt_id(recorded, job.trial_id)
        if trial_id is None:
            continue
        if clock.left() <= 0:
            return "time: the deadline came before every ablation trial ran"
        result = extra.run_trial(trial_id, job.params, job.tags)
        if not finished(result.to_dict()):
            return f"time: {result.reason}"
    return "done"


def ablation_rows(records: list[dict[str, Any]], of: int | str) -> list[dict[str, Any]]:
    """One row per configuration of the ablation of trial `of` (the best itself first,
    then each technique left out) and its repeats' statuses; what each one measured is
    pooled with the study's other measurements (training_harness.records.verdict)."""
    statuses: dict[str | None, list[str]] = {}
    for r in records:
        tag = tags_of(r).get("ablation") or {}
        if str(tag.get("of")) == str(of):
            statuses.setdefault(tag.get("without"), []).append(r["status"])
    rows = [{"without": without, "statuses": st} for without, st in statuses.items()]
    rows.sort(key=lambda row: (row["without"] is not None, str(row["without"])))
    return rows
