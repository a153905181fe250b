"""The contenders for the confirmation, chosen with the machine's drift taken into account.

A study measures each configuration once during the search; where the machine's speed
moves meanwhile, a configuration measured in a slow spell reads slower than one
measured in a fast spell. Once some configurations are measured again (the rounds),
each single figure is taken against the machine's speed at its moment
(training_harness.records.drift.machine_speed), so the truly fastest becomes a contender.
The records are synthetic, with seeded noise; nothing here depends on this machine.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from tests.tuner import fake_launch
from tests.tuner.conftest import records, tune, write_study
from tests.tuner.test_confirm import key, ranked_space, resolved_plan
from training_harness.records.drift import MachineSpeed
from training_harness.tune.final import confirmation as confirm

# true samples/s; D is the fastest, A the fastest of the rest
TRUE = {"base": 100, "A": 130, "B": 125, "C": 118, "E": 105, "F": 110, "G": 115, "H": 100,
        "I": 102, "J": 104, "K": 95, "D": 140}
SEARCH = ["base", "A", "B", "C", "E", "F", "G", "H", "I", "J", "K", "D"]  # in this order


def study_records(speed, rounds: int, noise: float, seed: int = 0) -> list[dict]:
    """The search (SEARCH, one measurement each), then `rounds` confirmation rounds of
    the contenders its raw figures pick and the baseline; each figure is TRUE times the
    machine's `speed(moment)`, times seeded noise within +-`noise`."""
    rng = random.Random(seed)
    out: list[dict] = []

    def measure(name: str, phase: str, rnd: int | None = None) -> None:
        at = len(out)
        tags = {"phase": phase, **({"confirm": {"of": name, "round": rnd}}
                                   if rnd is not None else {})}
        rate = TRUE[name] * speed(at) * rng.uniform(1 - noise, 1 + noise)
        out.append({"trial_id": name if rnd is None else f"confirm-{name}-{rnd}",
                    "status": "ok", "tags": tags, "plan": {"name": name, "config": name},
                    "started_at": f"2026-12-06T10:{at:02d}:00+00:00",
                    "metrics": {"samples_per_s": rate, "peak_memory_bytes": 1}})

    for name in SEARCH:
        measure(name, "baseline" if name == "base" else "search")
    picked = ids(confirm.contenders(out, 0.2, 0))
    for rnd in range(rounds):
        for name in [*picked, "base"]:
            measure(name, "confirm", rnd)
    return out


def ids(rows: list[dict]) -> list[str]:
    return [str(r["trial_id"]) for r in rows]


def search_only(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r["tags"]["phase"] != "confirm"]


def test_the_fastest_measured_in_a_slow_spell_is_a_contender():
    # the machine slows steadily, 3% of its first speed per measurement
    recs = study_records(lambda at: 1 - 0.03 * at, rounds=1, noise=0.03)
    raw = ids(confirm.contenders(search_only(recs), 0.2, 0))
    assert "D" not in raw and "A" in raw  # D, measured last, reads slowest of the good
    picked = ids(confirm.contenders(recs, 0.2, 0))
    assert picked[0] == "D" and len(picked) <= confirm.MAX_CONTENDERS
    # on the rounds' footing (D's figure over the speed interpolated at its moment),
    # D against A is what it truly is
    score, noise = confirm.drift_free(recs)
    d, a = (next(r for r in recs if r["trial_id"] == i) for i in "DA")
    assert score(d) / score(a) == pytest.approx(140 / 130, rel=0.05)
    assert 0 < noise < 0.5  # the normalisation's own error, measured


def test_without_drift_the_contenders_are_what_they_were():
    recs = study_records(lambda at: 1.0, rounds=2, noise=0.02)
    raw = ids(confirm.contenders(search_only(recs), 0.2, 0))
    assert raw == ["D", "A", "B", "C"]
    assert ids(confirm.contenders(recs, 0.2, 0)) == raw
    assert ids(confirm.contenders(recs, 0.01, 0)) == ["D", "A"]  # the two fastest at least


def test_a_configuration_measured_by_two_trials_takes_one_slot():
    recs = study_records(lambda at: 1.0, rounds=2, noise=0.02)
    # D sampled again by the search (same plan, another trial): its pooled figure is D's
    again = dict(next(r for r in recs if r["trial_id"] == "D"), trial_id="D-again")
    picked = ids(confirm.contenders([*recs, again], 0.01, 0))
    assert len(picked) == 2 and picked[0] in ("D", "D-again") and picked[1] == "A"


def test_the_machines_speed_between_references():
    speed = MachineSpeed([(0, 2.0), (10, 1.0), (12, 1.0)])
    assert speed.at(5) == pytest.approx(1.5) and speed.at(-3) == 2.0 and speed.at(20) == 1.0
    assert MachineSpeed().at(4) == 1.0 and MachineSpeed().uncertainty() == 0.0
    # left out, (0, 2.0) is predicted 1.0 (the nearest after it): the largest error
    assert speed.uncertainty(1.0) == pytest.approx(math.log(2.0))


@pytest.fixture
def tweak():
    yield fake_launch
    fake_launch.TWEAK = None


@pytest.mark.slow  # the quickstart's 60 configurations by grid, and the rounds: ~20 s here
def test_a_study_names_the_best_it_measured_in_a_slow_spell(tmp_path, launched, tweak):
    """The machine speeds up through the search (0.6 to 1 of its speed over the grid's
    60 configurations), with seeded noise of +-2%: the grid measures the optimum early,
    slow, and five configurations read faster. The first round's contenders leave it
    out; measured again, they show the drift, and it joins the next round and is named
    the best."""
    optimum = ranked_space()[0][1]
    rng = random.Random(5)

    def speeding_up(plan, rate, index):
        return rate * min(1.0, 0.6 + 0.4 * index / 60) * rng.uniform(0.98, 1.02), None

    tweak.TWEAK = speeding_up
    out = tmp_path / "run"
    path = write_study(tmp_path, sampler="grid", pruning={"slower_than": 0},
                       budget={"ablation_repeats": 0, "confirm_repeats": 2, "variants": False})
    assert tune(str(path), "--out", str(out), "--budget", "10m") == 0
    recs = records(out)
    plans = {str(r["trial_id"]): key(resolved_plan(r["plan"])) for r in recs}
    rounds: dict[int, set[str]] = {}
    for r in recs:
        if r["tags"]["phase"] == "confirm":
            of = str(r["tags"]["confirm"]["of"])
            rounds.setdefault(r["tags"]["confirm"]["round"], set()).add(plans[of])
    assert optimum not in rounds[0] and optimum in rounds[1]
    assert len(rounds[1]) <= confirm.MAX_CONTENDERS + 1  # and the baseline
    info = json.loads((out / "study.json").read_text())
    assert plans[str(info["best_trial_id"])] == optimum
