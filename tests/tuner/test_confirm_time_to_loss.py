"""The confirmation rounds of a study of time to a target loss (fake launcher).

The rounds measure the contenders' step time again; their steps to target stay the
cached ones, so each round's time to target is those steps times its step time. The
best is the lowest median time to target, and a rival within the seeds' spread of
steps is indistinguishable from it. tests/tuner/fake_target.py knows every answer.
"""

from __future__ import annotations

import json

import pytest

from tests.tuner import fake_launch, fake_target
from tests.tuner.conftest import records, study_table, write_study
from training_harness.cli.main import main
from training_harness.tune.final import confirmation as confirm

LAUNCHER = "tests.tuner.fake_target:launch"


def ttl_table() -> dict:
    """Global batch 16 or 32, AdamW or LAMB, micro-batch 8 or 16: 8 configurations."""
    table = study_table(objective="time_to_loss", target_loss=2.5, sampler="grid",
                        global_batch_size=[16, 32], micro_batch_sizes=[8, 16],
                        pruning={"slower_than": 0},
                        budget={"ablation_repeats": 0, "confirm_repeats": 2})
    table["workload"] = {"name": "gpt", "layers": 1, "heads": 2, "hidden": 32, "seq_len": 32,
                         "vocab": 256, "data": "text"}
    table["target"] = {"optimizer": ["adamw", "lamb"], "seeds": [0, 1, 2],
                       "max_samples": 4096, "eval_every": 512}
    del table["strategies"]
    return table


def time_to_target(plan: dict, rate: float) -> float:
    return fake_target.steps(plan, 1) * plan["global_batch_size"] / rate


@pytest.fixture
def tweak():
    yield fake_launch
    fake_launch.TWEAK = None


def test_a_lucky_step_time_does_not_name_the_best_time_to_target(
        tmp_path, launched, tweak, capsys):
    # batch 16 LAMB at micro-batch 8 is the optimum; batch 32 LAMB at 8 the runner-up
    def config(p):
        return p["global_batch_size"], "lamb" in p["strategies"], p["micro_batch_size"]

    seen = set()

    def lucky(plan, rate, index):  # the runner-up's first step time: 30% faster
        first = config(plan) == (32, True, 8) and "lucky" not in seen
        if first:
            seen.add("lucky")
        return (rate * 1.3 if first else rate), None

    tweak.TWEAK = lucky
    out = tmp_path / "run"
    path = write_study(tmp_path, ttl_table())
    assert main(["tune", str(path), "--out", str(out), "--budget", "10m",
                 "--launcher", LAUNCHER]) == 0
    recs = records(out)
    search = [r for r in recs if r["tags"]["phase"] != "confirm" and r["status"] == "ok"]
    assert len({json.dumps(config(r["plan"])) for r in search}) == 8
    first = min(search, key=lambda r: r["metrics"]["time_to_target_s"])
    assert config(first["plan"]) == (32, True, 8)  # one measurement says so
    rounds = [r for r in recs if r["tags"]["phase"] == "confirm"]
    # the grid measured the whole space early: its spare time buys rounds beyond the 2
    seen_rounds = {r["tags"]["confirm"]["round"] for r in rounds}
    assert seen_rounds == set(range(len(seen_rounds))) and len(seen_rounds) >= 2
    for r in rounds:  # the same steps, this round's step time
        m = r["metrics"]
        assert m["time_to_target_s"] == pytest.approx(
            m["steps_to_target"] * m["step_time_s"]["median"])
    info = json.loads((out / "study.json").read_text())
    best = next(r for r in recs if str(r["trial_id"]) == str(info["best_trial_id"]))
    assert config(best["plan"]) == (16, True, 8)  # the medians say otherwise
    decision = info["best_by_repeats"]
    assert decision["objective"] == "time_to_loss"
    assert decision["n"] == 1 + len(seen_rounds)
    assert decision["median"] == pytest.approx(time_to_target(best["plan"], 130.0))
    # the seeds (steps x 0.9 ... 1.1) overlap: the runner-up is not told apart from it
    assert str(first["trial_id"]) in decision["indistinguishable"]
    assert decision["standings"][str(best["trial_id"])]["seeds"] == pytest.approx(
        [0.9 * decision["median"], 1.1 * decision["median"]], rel=0.01)
    out_text = capsys.readouterr().out
    assert "batch 16 lamb: to target" in out_text  # the progress lines
    assert "s to target: median [min, max], n, [fastest, slowest seed]" in out_text


def test_the_seeds_spread_is_part_of_the_comparison():
    def rec(trial_id, time, seeds, phase="search", of=None):
        tags = {"phase": phase, **({"confirm": {"of": of, "round": 0}} if of is not None else {})}
        conv = {"time_spread_s": [time * (1 - seeds), time * (1 + seeds)]}
        # a confirmation round measures its trial's configuration again
        plan = {"name": trial_id, "config": of if of is not None else trial_id}
        return {"trial_id": trial_id, "status": "ok", "tags": tags, "plan": plan,
                "metrics": {"time_to_target_s": time, "samples_per_s": 1.0, "convergence": conv,
                            "peak_memory_bytes": 1}}

    def decision(seeds):
        recs = [rec(1, 10.0, seeds), rec(2, 11.0, seeds), rec(3, 20.0, seeds),
                rec("c1", 10.2, seeds, "confirm", 1), rec("c2", 11.1, seeds, "confirm", 2)]
        picked = confirm.contenders(recs, 0.2, 0, by="time_to_loss")
        assert [r["trial_id"] for r in picked] == [1, 2]  # 20 s is not within 20% of 10
        ids = [str(r["trial_id"]) for r in picked]
        return confirm.decide(confirm.standings(recs, ids, "time_to_loss"), None,
                              "time_to_loss")

    narrow = decision(0.01)  # the step times alone: 1 s apart, each within 0.2 s
    assert narrow.best == "1" and narrow.median == pytest.approx(10.1)
    assert narrow.indistinguishable == []
    wide = decision(0.1)  # seeds 10% either way: the same medians, no longer told apart
    assert wide.best == "1" and wide.indistinguishable == ["2"]
