"""The launcher's hooks for the tuner, on a real trial process: step times while it
runs (HARNESS_PROGRESS_FILE), and `should_stop` ending it as `pruned`."""

from __future__ import annotations

from tests.distributed.launch_helpers import assert_nothing_left, faulty_plan, launch_plan
from training_harness.records.step_log import read_steps


def test_steps_are_reported_and_should_stop_prunes(tmp_path, monkeypatch):
    from tests.distributed.launch_helpers import ROOT

    monkeypatch.chdir(ROOT)
    out, steps = tmp_path / "trial", tmp_path / "steps.log"
    plan = faulty_plan(world=1, steps=2000, timeout_s=120)
    seen: list[int] = []

    def should_stop() -> str | None:
        seen.append(len(read_steps(steps)))
        return "enough: 3 steps seen" if seen[-1] >= 3 else None

    result = launch_plan(plan, out, "harness bench x", progress_file=steps, should_stop=should_stop)
    # stopped by the hook, not by its 120-s timeout nor after its 2000 steps
    assert result.status == "pruned" and result.reason == "enough: 3 steps seen"
    times = read_steps(steps)
    assert 3 <= len(times) < 2000 and all(t > 0 for t in times)
    assert (out / "result.json").exists()
    assert_nothing_left(out)


def test_without_hooks_nothing_changes(tmp_path, monkeypatch):
    from tests.distributed.launch_helpers import ROOT

    monkeypatch.chdir(ROOT)
    result = launch_plan(faulty_plan(world=1, steps=2), tmp_path / "t", "harness bench x")
    assert result.status == "ok" and not (tmp_path / "t" / "steps.log").exists()


def test_the_ranks_read_the_prepared_plan_instead_of_preparing_again(tmp_path, monkeypatch):
    """A trial is prepared once: what prepared.json says (prediction, FLOPs, peak) is
    what the rank's record carries, so the rank neither estimated nor counted again."""
    from tests.distributed.launch_helpers import ROOT
    from training_harness.core.prepared import PreparedPlan
    from training_harness.launch.local import launch
    from training_harness.measure.prepare import prepare

    monkeypatch.chdir(ROOT)
    prepared = prepare(faulty_plan(world=1, steps=2)).checked()
    prepared.predicted = {"marker": "from prepared.json"}
    prepared.flops_per_sample = 1.5e9
    prepared.peak = {**prepared.peak, "flops": 3e12, "reason": "marker peak"}
    prepared.peak["measured"] = {"flops": 3e12, "source": "marker"}
    prepared.peak["used"] = "measured"
    out = tmp_path / "t"
    result = launch(prepared, out, "harness bench x")
    assert result.status == "ok", result.reason
    assert result.predicted == {"marker": "from prepared.json"}
    assert result.metrics["flops_per_step"] == 1.5e9 * prepared.plan.batch_size
    assert result.metrics["peak_flops"]["reason"] == "marker peak"
    assert result.metrics["mfu"] == result.metrics["tflops_per_device"] * 1e12 / 3e12
    assert PreparedPlan.read(out / "prepared.json").predicted == prepared.predicted
