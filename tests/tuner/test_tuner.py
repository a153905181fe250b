"""The tuner's loop with the fake launcher (no processes): pruning before launch,
the known optimum, early stopping, budgets, records, ablation, Optuna's view."""

from __future__ import annotations

import json
import tomllib

import optuna
from optuna.trial import TrialState

from tests.tuner import fake_launch
from tests.tuner.conftest import records, study_table, tune, write_study
from training_harness.core.plan import Plan
from training_harness.strategies.compose import resolved
from training_harness.study.search_space import SearchSpace, config_key
from training_harness.study.study_file import Study
from training_harness.tune.model import correction

KNOWN_OPTIMUM_TRIALS = 30  # seed 0 finds it at trial 8; seeds 0-11: trials 3 to 22


def optuna_trials(run_dir, name="quickstart"):
    """The trials a worker took (not the queue's leftovers, which never ran)."""
    from tests.tuner.test_tune_processes import journal_trials

    return journal_trials(run_dir / "optuna.journal", name)


def key(plan: dict) -> str:
    return config_key({**plan, "name": None})


def test_over_the_memory_budget_is_never_launched(tmp_path, launched):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0})
    # nothing fits: the study says so and exits 1
    assert tune(str(path), "--out", str(out), "--memory-budget", "1MiB", "--n-trials", "8") == 1
    assert launched == []
    recs = records(out)
    assert len(recs) == 8
    for r in recs:
        assert r["status"] == "pruned" and r["tags"]["pruned"] == "memory"
        assert "over the memory budget" in r["reason"]
        assert r["predicted"]["calibrated_peak_memory_bytes"] > 2**20
        assert not (out / "trials" / str(r["trial_id"]) / "logs").exists()
    for t in optuna_trials(out):  # infeasible, not FAIL: the sampler learns from it
        assert t.state == TrialState.COMPLETE and t.constraints["memory"] > 0
    assert not (out / "best.toml").exists()


def test_a_budget_between_configurations_launches_only_those_under_it(tmp_path, launched):
    from training_harness.measure.prepare import prepare

    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")
    peaks = sorted(prepare(space.plan(p)).predicted["peak_memory_bytes"]
                   for p in space.enumerate())
    budget = peaks[len(peaks) // 2]
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0})
    # Whatever the calibration makes of the fake's figures, the record keeps the
    # prediction each decision was made on. (The fake's measured peaks, hundreds of
    # MiB, are all over this budget: no trial is feasible, so the exit code is 1.)
    assert tune(str(path), "--out", str(out), "--memory-budget", str(budget),
                "--n-trials", "25") == 1
    recs = [r for r in records(out) if "duplicate_of" not in r["tags"]]
    ran = {key(c["plan"]) for c in launched}
    assert ran and any(r["tags"].get("pruned") == "memory" for r in recs)
    for r in recs:
        predicted = r["predicted"]["calibrated_peak_memory_bytes"]
        if key(r["plan"]) in ran:
            assert predicted <= budget
        else:
            assert r["status"] == "pruned" and predicted > budget


def test_reaches_the_known_optimum(tmp_path, launched):
    """The whole space (60 configurations) measured with the fake objective gives the
    optimum; the tuner (TPE, seed 0) must run it within KNOWN_OPTIMUM_TRIALS trials."""
    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")
    measured = {key(resolved(space.plan(p)).to_dict()): fake_launch.objective(space.plan(p))
                for p in space.enumerate()}
    ranked = sorted(measured.values(), reverse=True)
    assert len(measured) == 60 and ranked[0] > ranked[1]  # one optimum
    optimum = max(measured, key=measured.get)

    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0, "confirm_repeats": 0},
                       pruning={"slower_than": 0})
    assert tune(str(path), "--out", str(out), "--n-trials", str(KNOWN_OPTIMUM_TRIALS)) == 0
    recs = records(out)
    found = [r["trial_id"] for r in recs if key(r["plan"]) == optimum and r["status"] == "ok"]
    assert found and found[0] < KNOWN_OPTIMUM_TRIALS
    info = json.loads((out / "study.json").read_text())
    assert key(records(out)[info["best_trial_id"]]["plan"]) == optimum
    best = Plan.from_toml(out / "best.toml")
    assert key(resolved(best).to_dict() | {"name": None}) == optimum
    # a configuration proposed again is recorded from its first run, not launched again
    assert len(launched) == len({key(c["plan"]) for c in launched})
    assert all(r["tags"]["duplicate_of"] is not None for r in recs if "duplicate_of" in r["tags"])


def test_every_trial_is_a_record_with_its_tags(tmp_path, launched):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 2})
    assert tune(str(path), "--out", str(out), "--n-trials", "10") == 0
    recs = records(out)
    trials = optuna_trials(out)
    assert len(recs) == len(trials)
    assert len({str(r["trial_id"]) for r in recs}) == len(recs)
    by_number = {r["tags"]["optuna_number"]: r for r in recs}
    assert sorted(by_number) == [t.number for t in trials]
    phases = [r["tags"]["phase"] for r in recs]
    assert phases[:2] == ["baseline", "known-good"]
    assert set(phases) == {"baseline", "known-good", "search", "confirm", "ablation"}
    info = json.loads((out / "study.json").read_text())
    ablation = [r for r in recs if r["tags"]["phase"] == "ablation"]
    best = info["best_trial_id"]
    assert {r["tags"]["ablation"]["repeat"] for r in ablation} == {0, 1}
    withouts = {r["tags"]["ablation"]["without"] for r in ablation}
    best_plan = next(r["plan"] for r in recs if r["trial_id"] == best)
    on = {s for s in best_plan["strategies"] if s != "accumulation"}
    assert withouts == {None, *on}
    for r in ablation:
        assert r["tags"]["ablation"]["of"] == best
        assert r["trial_id"] == (f"ablation-{best}-{r['tags']['ablation']['without'] or 'best'}"
                                 f"-{r['tags']['ablation']['repeat']}")
        without = r["tags"]["ablation"]["without"]
        assert set(r["plan"]["strategies"]) - {"accumulation"} == on - {without}
    for r in recs:
        folder = out / "trials" / str(r["trial_id"])
        assert {"plan.toml", "command.txt", "result.json"} <= {p.name for p in folder.iterdir()}
    assert {"name", "objective", "directions", "budget_s", "memory_budget_bytes", "device",
            "started_at", "finished_at", "storage", "harness_version", "best_trial_id",
            "baseline_trial_id", "n_trials", "stopped_because"} <= info.keys()
    assert info["baseline_trial_id"] == 0 and info["n_trials"] == len(recs)
    stored = Study.from_dict(tomllib.loads((out / "study.toml").read_text()))
    assert stored.budget.n_trials == 10


def test_slow_trials_are_stopped_early(tmp_path, launched):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0},
                       pruning={"slower_than": 1.05, "min_steps": 2})
    assert tune(str(path), "--out", str(out), "--n-trials", "15") == 0
    slow = [r for r in records(out) if r["tags"].get("pruned") == "slow"]
    assert slow and all("stopped early after" in r["reason"] for r in slow)
    states = {t.number: t for t in optuna_trials(out)}
    stops: dict[str, int] = {}
    for r in slow:
        t = states[r["tags"]["optuna_number"]]
        # COMPLETE at the rate the stop judged (a PRUNED one drew TPE back to it)
        assert t.state == TrialState.COMPLETE and t.intermediate_values
        assert t.values == [r["metrics"]["slow_stop"]["samples_per_s"]]
        k = json.dumps(r["plan"]["strategies"], sort_keys=True) + str(r["plan"]["micro_batch_size"])
        if "duplicate_of" in r["tags"]:  # a third proposal: two slow stops rule it out
            assert stops.get(k, 0) >= 2
        else:  # proposed again once, a slow one runs again
            stops[k] = stops.get(k, 0) + 1
            assert stops[k] <= 2
    # the references are never stopped early
    assert all(r["status"] == "ok" for r in records(out)[:2])


def test_pareto_mode(tmp_path, launched, capsys):
    out = tmp_path / "run"
    path = write_study(tmp_path, objective=["throughput", "memory"],
                       budget={"ablation_repeats": 0})
    assert tune(str(path), "--out", str(out), "--n-trials", "12") == 0
    assert "Pareto front" in capsys.readouterr().out
    info = json.loads((out / "study.json").read_text())
    assert info["directions"] == ["maximize", "minimize"]
    ok = [t for t in optuna_trials(out) if t.state == TrialState.COMPLETE]
    assert all(len(t.values) == 2 for t in ok)


def test_a_trial_expected_to_overrun_is_not_started(tmp_path, launched, monkeypatch):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0})
    # A trial's start-up before any is measured, an hour here, does not fit in 60 s (a
    # session long enough that its own start, slow on a loaded machine, leaves it time
    # to ask: with 5 s, a 4-s start left none).
    monkeypatch.setitem(correction.DEFAULT_OVERHEAD_S, "cpu", 3600.0)
    assert tune(str(path), "--out", str(out), "--budget", "60s") == 1  # nothing tuned
    assert launched == []
    # each configuration proposed is skipped; after five in a row (or when the search's
    # time is gone: predicting the candidates takes seconds on a busy machine) it ends
    recs = records(out)
    assert 1 <= len(recs) <= 5
    for r in recs:
        assert r["tags"]["pruned"] == "time" and "not started" in r["reason"]
    # nothing of the configuration (the estimator's guesses not reached stay queued)
    assert {t.state for t in optuna_trials(out)} - {TrialState.WAITING} == {TrialState.FAIL}
    stopped = json.loads((out / "study.json").read_text())["stopped_because"]
    assert stopped.startswith("time: ")



def test_resume_runs_again_only_the_ablation_trials_that_never_finished(tmp_path, launched):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 1, "n_trials": 4})
    assert tune(str(path), "--out", str(out)) == 0
    lines = (out / "trials.jsonl").read_text().splitlines()
    ablation = [i for i, line in enumerate(lines) if '"phase": "ablation"' in line]
    assert len(ablation) >= 2
    cut = json.loads(lines[ablation[-1]])  # as if the deadline had stopped it
    cut["status"], cut["tags"]["deadline"] = "timeout", True
    lines[ablation[-1]] = json.dumps(cut)
    (out / "trials.jsonl").write_text("\n".join(lines) + "\n")
    launched.clear()
    assert tune("--resume", "--out", str(out)) == 0
    assert [c["trial_id"] for c in launched] == [f"{cut['trial_id']}-retry1"]
    ids = [str(r["trial_id"]) for r in records(out)]
    assert len(ids) == len(set(ids))


def test_a_trial_just_asked_by_another_worker_is_not_taken_for_abandoned(tmp_path, launched,
                                                                          monkeypatch):
    """Tuners sharing a storage start together: one's trial is RUNNING, not yet tagged
    with its worker, when the other settles what dead workers left (seen in CI)."""
    import datetime as dt
    import subprocess
    import sys

    import psutil

    from training_harness.tune.recovery import resume
    from training_harness.tune.workers import Worker

    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0, "n_trials": 2})
    assert tune(str(path), "--out", str(out)) == 0
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal")))
    study = optuna.load_study(study_name="quickstart", storage=storage)
    just_asked = study.ask()  # another worker's, this instant: no tag yet
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = Worker.this()
        live = Worker(me.host, other.pid, psutil.Process(other.pid).create_time())

        def tagged_meanwhile(seconds):  # --resume waits out the grace; the worker tags
            storage.set_trial_user_attr(just_asked._trial_id, "worker", live.tag)

        monkeypatch.setattr(resume, "_sleep", tagged_meanwhile)
        assert tune("--resume", "--out", str(out), "--n-trials", "3") == 0
        (t,) = [t for t in optuna_trials(out) if t.number == just_asked.number]
        assert t.state == TrialState.RUNNING  # the live worker's: left alone
        assert all(r["tags"].get("optuna_number") != t.number for r in records(out))
    finally:
        other.kill()
        other.wait()

    def frozen(worker=None, age_s=0.0):
        start = dt.datetime.now() - dt.timedelta(seconds=age_s)
        attrs = {"worker": worker} if worker else {}
        return optuna.trial.FrozenTrial(
            number=0, state=TrialState.RUNNING, value=None, datetime_start=start,
            datetime_complete=None, params={}, distributions={}, user_attrs=attrs,
            system_attrs={}, intermediate_values={}, trial_id=0)

    me = Worker.this()
    dead = Worker(me.host, me.pid, me.created - 100)  # its pid, since taken by another
    assert not resume._abandoned(frozen())
    assert resume._abandoned(frozen(age_s=resume.UNTAGGED_GRACE_S + 5))
    assert not resume._abandoned(frozen(me.tag, age_s=3600))
    assert resume._abandoned(frozen(dead.tag))
