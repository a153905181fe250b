"""Windows long enough to mean something (issue 23): warm-up runs until the step times
settle (the last 3 within 5%), up to a cap; the measured window lasts `steps` or a least
duration, whichever is longer; the record says how the window was chosen. A fake step
whose times settle after k steps, and a tiny GPT on the CPU."""

from __future__ import annotations

import pytest

from tests.test_measurement_window import PEAK
from tests.tiny import TINY_GPT
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.window import window_rule, window_steps
from training_harness.measure.prepare import prepare
from training_harness.measure.timing import settled, warm_up
from training_harness.measure.trial_loop import measure


class FakeSteps:
    """Step i takes `times[i]` seconds on a fake clock; stops going on at `stop_at`."""

    def __init__(self, times: list[float], stop_at: int | None = None) -> None:
        self.times, self.stop_at, self.now, self.ran = times, stop_at, 0.0, []

    def clock(self) -> float:
        return self.now

    def step(self, i: int) -> bool:
        self.ran.append(i)
        self.now += self.times[i]
        return i != self.stop_at


def ramp(k: int, n: int = 100) -> list[float]:
    """Step times that fall (clocks ramping up) for k steps, then hold at 1.0 (+-1%)."""
    return [2.0 - i / k for i in range(k)] + [1.0 + 0.01 * (i % 2) for i in range(n - k)]


@pytest.mark.parametrize("k", [2, 5, 12])
def test_warm_up_runs_until_the_step_times_settle(k):
    fake = FakeSteps(ramp(k))
    times, is_settled = warm_up(fake.step, 3, 50, clock=fake.clock)
    assert is_settled is True
    assert len(times) == max(3, k + 3)  # the first 3 settled steps, never fewer than asked
    assert times == pytest.approx(fake.times[:len(times)])
    assert settled(times)


def test_warm_up_stops_at_its_cap_where_the_times_never_settle():
    fake = FakeSteps([1.0 + 0.2 * (i % 2) for i in range(100)])
    times, is_settled = warm_up(fake.step, 3, 20, clock=fake.clock)
    assert len(times) == 20 and is_settled is False


def test_warm_up_with_no_room_runs_what_was_asked_and_judges_nothing():
    fake = FakeSteps(ramp(10))
    times, is_settled = warm_up(fake.step, 4, 4, clock=fake.clock)
    assert fake.ran == [0, 1, 2, 3] and is_settled is None


def test_a_divergence_stops_warm_up():
    fake = FakeSteps(ramp(10), stop_at=5)
    times, _ = warm_up(fake.step, 3, 50, clock=fake.clock)
    assert fake.ran == [0, 1, 2, 3, 4, 5]


def test_the_ranks_decide_together():
    """One rank settled is not enough: `agree` (all ranks) says go on."""
    fake = FakeSteps(ramp(2))
    asked = []
    times, is_settled = warm_up(fake.step, 3, 8, clock=fake.clock,
                                agree=lambda mine: asked.append(mine) or False)
    assert len(times) == 8 and is_settled is False and asked[-1] is True


def test_the_window_lasts_steps_or_its_least_duration_whichever_is_longer():
    assert window_steps(10, 2.0, 0.01) == 220  # 2 s at 10 ms, 10% more
    assert window_steps(500, 2.0, 0.01) == 500
    assert window_steps(10, 0.0, 0.01) == 10
    assert window_steps(10, 2.0, None) == 10


def test_the_defaults_are_for_cuda_and_a_cpu_keeps_its_speed():
    assert window_rule(3, 10, None, None, "cuda") == (50, 2.0)
    assert window_rule(3, 10, None, None, "cpu") == (3, 0.0)
    assert window_rule(3, 10, 20, 0.5, "cpu") == (20, 0.5)
    assert window_rule(3, 10, 1, 0.0, "cuda") == (3, 0.0)  # never below warmup_steps
    with pytest.raises(HarnessError, match="min_window_s"):
        Plan(min_window_s=-1.0).validate("plan")
    with pytest.raises(HarnessError, match="warmup_max_steps"):
        Plan(warmup_max_steps=-1).validate("plan")


def _prepared(**settings):
    plan = Plan(name="window", workload="tests.faulty_workload:build", workload_args=TINY_GPT,
                device="cpu", micro_batch_size=4, warmup_steps=2, steps=4, **settings)
    return prepare(plan, peaks={"fp32": PEAK, "tf32": {**PEAK, "dtype": "tf32"}})


def test_a_cpu_trial_by_default_runs_as_asked_and_says_so():
    metrics, status, _ = measure(_prepared())
    assert status == "ok"
    w = metrics["window"]
    assert (w["warmup_steps_run"], w["settled"], w["min_seconds"]) == (2, None, 0.0)
    assert w["steps"] == w["steps_planned"] == 4
    assert metrics["loss"]["warmup_steps"] == 2 and len(metrics["loss"]["values"]) == 6


def test_a_trial_with_a_least_duration_measures_longer():
    # a warm-up cap of 8 (not 30): room to judge, and on a loaded machine, where the step
    # times do not settle, 8 warm-up steps run, not 30 (most of this test's CPU time)
    metrics, status, _ = measure(_prepared(warmup_max_steps=8, min_window_s=0.3))
    assert status == "ok"
    w = metrics["window"]
    assert 2 <= w["warmup_steps_run"] <= 8 and isinstance(w["settled"], bool)
    assert w["min_seconds"] == 0.3
    # as many steps as last 0.3 s at the warm-up's pace (a loaded machine's pace too)
    assert w["steps"] == w["steps_planned"] == window_steps(4, 0.3, w["warmup_step_s"])
    assert len(metrics["loss"]["values"]) == w["warmup_steps_run"] + w["steps"]
