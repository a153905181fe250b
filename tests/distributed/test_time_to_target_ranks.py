"""Time to a target loss on two data-parallel ranks (gloo, DDP, forked by the launcher
with a free port of its own): the steps to target are the one-process run's, taken
from the cache (a layout leaves the maths unchanged), times the two ranks' step time."""

from __future__ import annotations

import pytest

from tests.distributed.launch_helpers import (
    assert_nothing_left,
    in_repo_root,  # noqa: F401  (a fixture)
    launch_plan,
    needs_ddp,
)
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import TargetSpec
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("in_repo_root")]

TEXT = dict(layers=1, heads=2, hidden=32, seq_len=32, vocab=256, data="text")
PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}


def plan(data: int) -> Plan:
    p = Plan(name="ttl-ranks", workload="gpt", workload_args=TEXT, device="cpu",
             layout=Layout(data=data), micro_batch_size=8, global_batch_size=16,
             strategies={"ddp": {}} if data > 1 else {"accumulation": {}},
             warmup_steps=1, steps=2, timeout_s=120,
             target=TargetSpec(loss=4.5, seeds=[0, 1], max_samples=256, eval_every=64,
                               eval_samples=32))
    p.optimizer.lr = 1e-2
    return p


@pytest.mark.slow  # a 2-rank trial and the one-process run it is checked against
@pytest.mark.timeout(180)
def test_two_ranks_take_the_one_process_steps_to_target(tmp_path, monkeypatch):
    needs_ddp()
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))  # the ranks get it too
    one = run_trial(prepare(plan(1), peaks={"fp32": PEAK}), "test")
    assert one.status == "ok", one.reason
    assert not any(r["cached"] for r in one.metrics["convergence"]["runs"])  # trained

    out = tmp_path / "ddp"
    two = launch_plan(plan(2), out, "test")
    assert two.status == "ok", two.reason
    conv, m = two.metrics["convergence"], two.metrics
    assert len(m["per_rank"]) == 2
    assert all(r["cached"] for r in conv["runs"])  # none trained again
    steps = {r["seed"]: r["steps_to_target"] for r in conv["runs"]}
    assert steps == {r["seed"]: r["steps_to_target"] for r in one.metrics["convergence"]["runs"]}
    assert m["steps_to_target"] == one.metrics["steps_to_target"]
    # the time is the two ranks' own: their (slowest rank's) median step time
    assert m["time_to_target_s"] == pytest.approx(
        m["steps_to_target"] * m["step_time_s"]["median"])
    assert conv["global_batch"] == 16 and conv["optimizer"] == "adamw"
    assert_nothing_left(out)
