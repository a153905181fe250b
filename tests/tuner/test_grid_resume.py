"""A grid study resumed measures every configuration of its grid, also those an earlier
session skipped as not fitting its time (training_harness.tune.recovery.grid_rest): the GPU table
(harness selftest --gpu --only table) is recorded over several short sessions."""

from __future__ import annotations

import json

import optuna
from optuna.trial import TrialState

from tests.tuner.conftest import SEARCH_ONLY, records, tune, write_study
from training_harness.records.tags import PRUNED_TIME
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.model import correction
from training_harness.tune.recovery.grid_rest import requeue_grid


def test_a_resumed_grid_measures_what_an_earlier_session_skipped_for_time(tmp_path, launched,
                                                                          monkeypatch):
    out = tmp_path / "run"
    # as the table study: a grid, nothing stopped early
    path = write_study(tmp_path, sampler="grid", budget=SEARCH_ONLY, pruning={"slower_than": 0})
    # A trial's start-up before any is measured, an hour here, fits no 60-s session:
    # each configuration asked is skipped, not started, and the rest stay queued. (The
    # session is long enough that its own start, slow on a loaded machine, leaves it
    # time to ask: with 5 s, a 4-s start left none.)
    default = correction.DEFAULT_OVERHEAD_S["cpu"]
    monkeypatch.setitem(correction.DEFAULT_OVERHEAD_S, "cpu", 3600.0)
    assert tune(str(path), "--out", str(out), "--budget", "60s") == 1
    skipped = [r for r in records(out) if r["tags"].get("pruned") == PRUNED_TIME]
    assert skipped and not launched
    # the default start-up (5 s on a CPU) fits the next session
    monkeypatch.setitem(correction.DEFAULT_OVERHEAD_S, "cpu", default)
    assert tune("--resume", "--out", str(out), "--budget", "10m") == 0
    study = optuna.load_study(study_name="quickstart", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal"))))
    space = SearchSpace.of(Study.from_toml(out / "study.toml"), "cpu")
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    grid = {json.dumps(p, sort_keys=True) for p in space.enumerate()}
    # the configurations skipped in the first session too, each from the queue (not
    # found by chance among the sampler's leftovers), and none twice
    assert grid == {json.dumps(t.params, sort_keys=True) for t in complete}
    assert all("fixed_params" in t.system_attrs for t in complete)
    assert len(launched) == len(grid)


def test_requeue_leaves_measured_waiting_and_orphaned_configurations(tmp_path):
    grid = [{"x": i} for i in range(6)]
    study = optuna.create_study()
    dist = optuna.distributions.CategoricalDistribution(list(range(6)))
    for i, state in [(0, TrialState.COMPLETE), (1, TrialState.FAIL), (2, TrialState.FAIL),
                     (3, TrialState.PRUNED)]:
        study.add_trial(optuna.trial.create_trial(
            params={"x": i}, distributions={"x": dist}, state=state,
            value=1.0 if state == TrialState.COMPLETE else None))
    study.enqueue_trial({"x": 4})  # waiting: queued already
    orphan = {"tags": {"optuna_number": 2, "orphan": True}}  # its retries are resume.py's
    assert requeue_grid(study, grid, 0, [orphan]) == 2  # x=1 (skipped for time) and x=5
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.system_attrs["fixed_params"]["x"] for t in waiting) == [1, 4, 5]
    assert requeue_grid(study, grid, 0, [orphan]) == 0  # queued once


def test_the_replay_takes_from_a_table_only_what_it_measured():
    """The H200 table of 2026-11-27: 12 records, 5 of them skipped for time. The replay
    (tests/benchmarks/search_replay.py) holds the 7 measured, not the 5 at 0 samples/s."""
    from tests.benchmarks.search_replay import ROOT, load_table

    folder = ROOT / "tests" / "benchmarks" / "tables" / "gpt2-small-1gpu_h200"
    table, study, space = load_table(folder)
    assert len(records(folder)) == 12 and len(table) == 7
    assert all(row["rate"] > 0 for row in table.values())
    assert len(space.enumerate()) == 378  # the space as the GPU resolved it
