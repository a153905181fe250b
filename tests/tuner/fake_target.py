"""The fake launcher (tests/tuner/fake_launch.py) for a study of time to a target loss.

Each seed's steps to target are known in advance (`steps`: by global batch, optimizer
and seed), so a test knows every configuration's time to target: those steps times
the fake step time (global batch / the fake throughput). The record's convergence
is made by the real training_harness.measure.time_to_target.summarize, as a trial's is.
"""

from __future__ import annotations

from pathlib import Path

from tests.tuner import fake_launch
from training_harness.measure.time_to_target import summarize

STEPS = {16: 400, 32: 220}  # AdamW's steps to target by global batch
LAMB = 0.9  # LAMB needs this share of them
SEEDS = {0: 0.9, 1: 1.0, 2: 1.1}  # and each seed this share again


def steps(plan: dict, seed: int) -> int:
    lamb = LAMB if "lamb" in (plan.get("strategies") or {}) else 1.0
    return round(STEPS[plan["global_batch_size"]] * lamb * SEEDS[seed])


def launch(prep, out_dir, command, **kw):
    result = fake_launch.launch(prep, out_dir, command, **kw)
    target = prep.plan.target
    if result.status == "ok" and target is not None:
        plan = prep.plan.to_dict()
        runs = [{"seed": s, "reached": True, "stopped": "reached", "cached": False,
                 "steps_to_target": steps(plan, s),
                 "samples_to_target": steps(plan, s) * prep.plan.batch_size,
                 "best_val_loss": target.loss} for s in target.seeds]
        step_s = result.metrics["step_time_s"]["median"]
        conv = summarize(runs, step_s, target.loss, plan)
        result.metrics.update(convergence=conv, steps_to_target=conv["steps_to_target"],
                              time_to_target_s=conv["time_to_target_s"])
        result.write(Path(out_dir) / "result.json")
    return result
