"""A resumed grid study queues again the configurations it has not measured.

A grid study queues its whole grid once, when it is created (training_harness.tune.session). A
configuration then skipped as not fitting the time left (a `pruned` record, tag
pruned="time") or cut off at the deadline leaves Optuna a FAIL trial, and nothing would
run it again: a table recorded over several sessions (harness selftest --gpu --only
table) lost the last few configurations of every session. On --resume each grid
configuration with no trial that measured it, none waiting or running, and no orphan
(the retries of a dead worker's trial are counted by training_harness.tune.recovery.resume) is
queued again, in the grid's own seeded order.
"""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import TrialState

from training_harness.records.tags import tags_of
from training_harness.study.space_sampling import key

# Trials whose configuration needs nothing more: measured (or found not to run), pruned
# by Optuna's rules, or already queued or running.
_COVERED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING, TrialState.RUNNING)


def seeded_grid(grid: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The grid in the order a grid study queues it: shuffled by the study's seed."""
    grid = list(grid)
    random.Random(seed).shuffle(grid)
    return grid


def requeue_grid(optuna_study: optuna.Study, grid: list[dict[str, Any]], seed: int,
                 records: list[dict[str, Any]]) -> int:
    """Queue each configuration of `grid` (shuffled by `seed`, as when it was first
    queued) that no trial covers; how many were queued."""
    orphans = {tags_of(r).get("optuna_number") for r in records if tags_of(r).get("orphan")}
    covered = set()
    for t in optuna_study.get_trials(deepcopy=False):
        if t.state in _COVERED or t.number in orphans:
            # a queued trial holds its configuration as fixed_params until it is asked
            covered.add(key(t.system_attrs.get("fixed_params") or t.params))
    queued = 0
    for params in seeded_grid(grid, seed):
        if key(params) not in covered:
            optuna_study.enqueue_trial(params, user_attrs={"phase": "search"})
            queued += 1
    return queued
