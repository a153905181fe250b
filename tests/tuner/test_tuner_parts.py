"""The tuner's parts, one at a time: Optuna outcomes, calibration, the clock, one
trial's deadline, the run folder's log."""

from __future__ import annotations

import time

import pytest
from optuna.trial import TrialState

from tests.tuner import fake_launch
from tests.tuner.conftest import study_table
from training_harness.records.result import TrialResult, empty_metrics
from training_harness.records.run_store import RunStore
from training_harness.study import references
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study
from training_harness.tune.budget import Clock, fits, launch_timeout, memory_budget_bytes
from training_harness.tune.model.correction import Correction
from training_harness.tune.optuna_outcome import CANNOT_RUN, outcome
from training_harness.tune.storage import redact
from training_harness.tune.trial_job import TrialRunner, run_trial_job

GIB = 2**30


def record(status, tags=None, peak=None, rate=None, predicted=None):
    m = empty_metrics()
    m.update(peak_memory_bytes=peak, samples_per_s=rate)
    return {"status": status, "tags": tags or {}, "metrics": m,
            "predicted": {"peak_memory_bytes": predicted} if predicted else None}


MIB = 2**20
RUNS = CANNOT_RUN


@pytest.mark.parametrize("rec, state, values, constraints", [
    # the memory constraint is the excess over the 2 GiB budget, in bytes (negative: room)
    (record("ok", peak=GIB, rate=50.0), TrialState.COMPLETE, [50.0],
     {"memory": -GIB, "runs": 0}),
    (record("ok", peak=3 * GIB, rate=50.0), TrialState.COMPLETE, [50.0],
     {"memory": GIB, "runs": 0}),
    (record("pruned", {"pruned": "memory"}, predicted=4 * GIB), TrialState.COMPLETE, [0.0],
     {"memory": 2 * GIB, "runs": 0}),
    (record("oom"), TrialState.COMPLETE, [0.0], {"memory": MIB, "runs": 0}),  # at least 1 MiB
    (record("oom", peak=2 * GIB + 5 * MIB), TrialState.COMPLETE, [0.0],
     {"memory": 5 * MIB, "runs": 0}),
    (record("oom", predicted=3 * GIB), TrialState.COMPLETE, [0.0], {"memory": GIB, "runs": 0}),
    (record("failed"), TrialState.COMPLETE, [0.0], {"memory": 0, "runs": RUNS}),
    (record("diverged"), TrialState.COMPLETE, [0.0], {"memory": 0, "runs": RUNS}),
    (record("timeout"), TrialState.COMPLETE, [0.0], {"memory": 0, "runs": RUNS}),
    (record("pruned", {"pruned": "refused"}), TrialState.COMPLETE, [0.0],
     {"memory": 0, "runs": RUNS}),
    (record("pruned", {"pruned": "slow"}), TrialState.PRUNED, None, {"memory": 0, "runs": 0}),
    (record("timeout", {"deadline": True}), TrialState.FAIL, None, {}),
    (record("pruned", {"pruned": "time"}), TrialState.FAIL, None, {}),
    (record("failed", {"orphan": True}), TrialState.FAIL, None, {}),
])
def test_what_optuna_is_told(rec, state, values, constraints):
    got = outcome(rec, ["throughput"], 2 * GIB)
    assert got.state == state and got.values == values
    assert got.constraints == pytest.approx(constraints)


def test_two_objectives_worst_values():
    got = outcome(record("oom", peak=5 * GIB), ["throughput", "memory"], 2 * GIB)
    assert got.values == [0.0, 5 * GIB] and not got.feasible
    ok = outcome(record("ok", peak=GIB, rate=9.0), ["throughput", "memory"], 2 * GIB)
    assert ok.values == [9.0, GIB] and ok.feasible


def test_calibration_from_measured_trials():
    def measured(peak, base, predicted_peak, step, predicted_step, duration):
        m = empty_metrics()
        m.update(peak_memory_bytes=peak, step_time_s={"median": step},
                 memory={"allocated": None, "rss": peak, "rss_base": base})
        return {"status": "ok", "metrics": m, "duration_s": duration,
                "plan": {"warmup_steps": 2, "steps": 8},
                "predicted": {"peak_memory_bytes": predicted_peak,
                              "step_time_s": predicted_step}}

    cal = Correction.from_records([
        measured(500, 300, 100, 0.2, 0.1, 7.0),
        measured(700, 300, 200, 0.3, 0.1, 8.0),
        measured(900, 300, 300, 0.4, 0.1, 9.0),
        record("failed"),
    ])
    assert cal.runtime_bytes == 300 and cal.memory_ratio == 2.0
    assert cal.step_ratio == pytest.approx(3.0)
    assert cal.overhead_s == pytest.approx(5.0)
    assert cal.peak_memory({"peak_memory_bytes": 1000}) == 2300
    assert cal.trial_seconds({"step_time_s": 0.1}, 10, "cpu") == pytest.approx(5 + 10 * 0.3)
    fresh = Correction()
    # the default overhead: 5 s on a CPU
    assert fresh.trial_seconds({"step_time_s": 1.0}, 4, "cpu") == 9.0


def test_calibration_on_a_gpu_counts_the_cuda_context():
    """On a GPU the peak is what the device held; what it held before the model (the
    context) is the runtime, assumed 1 GiB until a trial measures it."""
    def measured(held, base, predicted_peak):
        m = empty_metrics()
        m.update(peak_memory_bytes=held, step_time_s={"median": 0.1},
                 memory={"allocated": held // 2, "device_held": held, "device_base": base})
        return {"status": "ok", "metrics": m, "duration_s": 5.0,
                "plan": {"warmup_steps": 1, "steps": 1},
                "predicted": {"peak_memory_bytes": predicted_peak, "step_time_s": 0.1}}

    assert Correction.from_records([], "cuda").peak_memory({"peak_memory_bytes": GIB}) == 2 * GIB
    cal = Correction.from_records([measured(5 * GIB, GIB, 2 * GIB)], "cuda")
    assert cal.runtime_bytes == GIB and cal.memory_ratio == 2.0
    no_nvml = Correction.from_records([measured(5 * GIB, None, 5 * GIB)], "cuda")
    assert no_nvml.runtime_bytes == 0 and no_nvml.memory_ratio == 1.0


def test_clock_and_budgets():
    clock = Clock.start(100.0, 0.2, now=1000.0)
    assert clock.search_end == 1080.0 and clock.deadline == 1100.0
    assert clock.left(now=1090.0) == 10.0 and clock.search_left(now=1090.0) == -10.0
    assert fits(8.0, 10.0) and not fits(9.0, 10.0)  # 25% margin
    assert launch_timeout(900.0, 12.0) == 12.0 and launch_timeout(60.0, 500.0) == 60.0
    assert memory_budget_bytes("70GiB", 80 * GIB) == 70 * GIB
    assert memory_budget_bytes(0.5, 80 * GIB) == 40 * GIB


def study_run(store: RunStore) -> TrialRunner:
    """What a study's trials share, with the facts and the helper `harness tune` uses."""
    from training_harness.launch.launcher import FunctionLauncher
    from training_harness.launch.torch_helper import shared

    probe = shared()
    facts = probe.study_facts(Study.from_dict(study_table()))
    return TrialRunner("s", store, 100 * GIB, facts, probe, FunctionLauncher(fake_launch.launch))


def test_a_running_trial_is_stopped_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_S", "20")
    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")
    plan = space.plan(space.params_for(references.baseline(space)))
    store = RunStore(tmp_path / "run")
    store.create("")
    run = study_run(store)
    run.torch_helper.prepare(plan, run.facts.peaks)  # the helper's start is not the trial's:
    quick = Correction(overhead_s=0.1)  # on a loaded machine it ate the 3 s (pruned: time)
    result = run_trial_job(run, 0, plan, {"phase": "search"}, quick, time.time() + 3.0)
    # stopped at the deadline, not run to its 20 s: the record says so (no clock is read here)
    assert result.status == "timeout" and result.tags["deadline"]
    assert "deadline" in result.reason
    assert outcome(result.to_dict(), ["throughput"], GIB).state == TrialState.FAIL


def test_a_plan_this_machine_refuses_is_not_launched(tmp_path):
    from training_harness.core.plan import Layout

    space = SearchSpace.of(Study.from_dict(study_table()), "cpu")
    plan = space.plan(space.params_for(references.baseline(space)))
    plan = plan.replace(layout=Layout(data=2))  # data parallel without ddp or zero
    store = RunStore(tmp_path / "run")
    store.create("")
    fake_launch.CALLS.clear()
    run = study_run(store)
    result = run_trial_job(run, 3, plan, {}, Correction(), time.time() + 60)
    assert fake_launch.CALLS == [] and result.status == "pruned"
    assert result.tags["pruned"] == "refused" and "cannot run here" in result.reason
    assert outcome(result.to_dict(), ["throughput"], GIB).constraints["runs"] == CANNOT_RUN


def test_trials_jsonl_lines_never_interleave(tmp_path):
    """Four processes appending at once: every line whole."""
    import json
    import multiprocessing

    store = RunStore(tmp_path)
    store.create("")
    procs = [multiprocessing.get_context("fork").Process(target=_append_many,
                                                         args=(str(tmp_path), w))
             for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lines = store.trials_jsonl.read_text().splitlines()
    assert len(lines) == 4 * 50
    ids = {json.loads(line)["trial_id"] for line in lines}
    assert len(ids) == 200


def _append_many(root: str, worker: int) -> None:
    store = RunStore(root)
    for i in range(50):
        store.append(TrialResult(study="s", trial_id=f"{worker}-{i}", status="ok", reason=None,
                                 plan={"x": "y" * 5000}, predicted=None))


def test_storage_password_is_redacted():
    assert redact("postgresql://tuner:s3cret@db:5432/h") == "postgresql://tuner:***@db:5432/h"
    assert redact("sqlite:///x.db") == "sqlite:///x.db"


def test_a_trial_over_the_memory_budget_is_marked_and_never_shown_as_best(capsys):
    """A GPU's device-held peak can pass the budget although its prediction did not:
    the trial ran, the table marks it, and the progress never calls it the best."""
    from training_harness.tune.final.summary import table
    from training_harness.tune.progress import Progress

    def measured(trial_id, rate, peak):
        r = record("ok", {"phase": "search"}, peak=peak, rate=rate)
        return {**r, "trial_id": trial_id, "plan": {"micro_batch_size": 8, "strategies": {}}}

    fast_but_over, within = measured(1, 300.0, 3 * GIB), measured(2, 60.0, GIB)
    text = table([fast_but_over, within], multi=False, memory_budget=2 * GIB)
    first = text.splitlines()[1]
    assert first.startswith("  1!") and "over the budget, 2.00 GiB" in text
    assert "!" not in table([fast_but_over, within], multi=False)  # no budget, no mark
    progress = Progress("s", Clock.start(60.0, 0.2), live=False, memory_budget=2 * GIB)
    progress.event("end", fast_but_over)
    progress.event("end", within)
    assert progress.best[1] == 2
    assert "over the budget 2.00 GiB" in capsys.readouterr().out
