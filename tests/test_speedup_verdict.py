"""Speedups with an interval, pooled figures and drift, on seeded synthetic measurements
(training_harness.records.speedup, .pooled, .drift, .verdict). Nothing here times this machine:
every figure is drawn from a seeded random generator, and each claim is checked over
many seeded draws, not one lucky one.

"±10% noise" is a factor drawn uniformly from [0.9, 1.1], the spread of one
configuration's measurements in issue 38's table.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from training_harness.records import speedup
from training_harness.records.drift import drift
from training_harness.records.pooled import config_key, pool
from training_harness.records.speedup import FASTER, SAME, SLOWER, ratio
from training_harness.records.verdict import study_verdict

FIXTURE = Path(__file__).parent / "fixtures" / "issue38-quickstart"


def draws(rng: random.Random, true: float, n: int, noise: float = 0.10) -> list[float]:
    return [100 * true * rng.uniform(1 - noise, 1 + noise) for _ in range(n)]


def test_the_exact_null_distributions():
    # Mann-Whitney U for 5 and 5: C(10, 5) = 252 arrangements, 1, 1, 2, 3, 5 ways for U = 0..4
    counts = speedup._rank_sum_counts(5, 5)
    assert sum(counts) == 252 and counts[:5] == [1, 1, 2, 3, 5] and counts == counts[::-1]
    # Wilcoxon W+ for 6 pairs: 2**6 sign patterns
    signed = speedup._signed_rank_counts(6)
    assert sum(signed) == 64 and signed[:4] == [1, 1, 1, 2]
    # 5 and 5: the 3rd smallest to the 3rd largest of the 25 differences, coverage 1 - 8/252
    est, lo, hi, cover = speedup.rank_sum_interval(list(range(5)), [x + 0.5 for x in range(5)])
    diffs = sorted(a - b - 0.5 for a in range(5) for b in range(5))
    assert (lo, hi) == (diffs[2], diffs[-3]) and cover == pytest.approx(1 - 8 / 252)


def test_a_true_ten_percent_with_ten_percent_noise_is_called_faster():
    calls = []
    for seed in range(100):
        rng = random.Random(seed)
        r = ratio(draws(rng, 1.10, 20), draws(rng, 1.00, 20))
        calls.append(r.verdict)
        if r.verdict == FASTER:
            assert r.lo > 1.02 and r.lo <= r.estimate <= r.hi
    assert calls.count(FASTER) >= 90 and SLOWER not in calls


def test_a_true_one_is_not_called_faster_in_95_percent_of_200_draws():
    for n in (5, 10):  # the quickstart's five measurements each, and more
        called, covered = [], 0
        for seed in range(200):
            rng = random.Random(1000 * n + seed)
            r = ratio(draws(rng, 1.0, n), draws(rng, 1.0, n))
            called.append(r.verdict)
            covered += r.lo <= 1 <= r.hi
        assert called.count(FASTER) <= 10  # 95% or more of the 200 are not called faster
        assert covered >= 190  # the 95% interval holds the true ratio


def test_pairs_taken_close_together_see_through_a_slow_spell():
    # eight rounds, each on a machine up to 30% slower: unpaired the spread hides 5%,
    # paired it does not
    rng = random.Random(7)
    a, b = [], []
    for _ in range(8):
        spell = rng.uniform(0.7, 1.0)
        a.append(105 * spell * rng.uniform(0.99, 1.01))
        b.append(100 * spell * rng.uniform(0.99, 1.01))
    rounds = list(range(8))
    paired = ratio(a, b, rounds, rounds)
    assert paired.method == "paired" and paired.n_a == 8 and paired.verdict == FASTER
    assert ratio(a, b).verdict == SAME


def test_too_few_measurements_give_no_interval_and_no_verdict():
    r = ratio([120.0, 121.0], [100.0, 101.0])  # 2 and 2: at best 1 - 2/6 coverage
    assert r.lo is None and r.verdict == SAME and "no 95% interval" in r.text()


def record(tid, strategies, rate, at, tags=None):
    return {"trial_id": tid, "status": "ok", "started_at": f"2026-01-01T00:{at:02d}:00",
            "plan": {"name": str(tid), "micro_batch_size": 16, "strategies": strategies,
                     "min_window_s": at},  # how long it was measured: not its configuration
            "metrics": {"samples_per_s": rate}, "tags": tags or {"phase": "search"}}


def test_every_phase_of_a_configuration_pools_into_one_figure():
    confirm = {"phase": "confirm", "confirm": {"of": "1", "round": 0}}
    ablation = {"phase": "ablation", "ablation": {"of": 1, "without": "fused", "repeat": 0}}
    busy = {"samples_per_s": 200, "interference": {"flagged": True}}
    recs = [record(0, {}, 70, 0, {"phase": "baseline"}), record(1, {"fused": {}}, 80, 1),
            record("c", {"fused": {}}, 84, 2, confirm), record("a", {}, 76, 3, ablation),
            record("v", {"fused": {}}, 90, 4, {"phase": "variant"}),
            {**record("busy", {}, 200, 5), "metrics": busy},
            record("dup", {}, 300, 6, {"phase": "search", "duplicate_of": 0}),
            record("r", {}, 74, 8, {"phase": "search", "retry_of": 4}),  # a resumed session
            {**record("oom", {}, 1, 7), "status": "oom"}]
    pools = pool(recs)
    assert len(pools) == 2
    plain = pools[config_key(recs[0]["plan"])]
    assert plain.values == [70, 76, 74]
    assert plain.phases == {"baseline": 1, "ablation": 1, "search": 1}
    fused = pools[config_key(recs[1]["plan"])]
    assert fused.n == 3 and fused.median == 84 and (fused.lo, fused.hi) == (80, 90)


def test_drift_of_ten_percent_over_a_study_is_named():
    def study(seed, slide):
        rng = random.Random(seed)
        recs, at = [], 0
        for rnd in range(8):  # three configurations, measured round by round
            for cfg, speed in enumerate((100, 120, 140)):
                machine = 1 - slide * at / 23  # 1 at the start, 1 - slide at the end
                recs.append(record(f"{cfg}-{rnd}", {"cfg": {"n": cfg}},
                                   speed * machine * rng.uniform(0.97, 1.03), at))
                at += 1
        return recs

    named = [drift(pool(study(seed, 0.10))) for seed in range(50)]
    assert sum(d.named for d in named) >= 45
    assert all(d.late_over_early.estimate < 1 for d in named if d.named)
    assert "the machine drifted" in named[0].text()
    # the tuner's summary names it under its headline
    from training_harness.tune.final.summary import verdict_text

    said = verdict_text(study_verdict(study(0, 0.10), "2-0", "0-0")).splitlines()
    assert said[0].startswith("The best configuration trains") and said[-1].startswith(
        "  the machine drifted: measurements in the second half of the study ran 0.9")
    steady = [drift(pool(study(seed, 0.0))) for seed in range(50)]
    assert sum(d.named for d in steady) <= 5


def test_the_issue_38_study_is_not_distinguishable_and_the_ablation_agrees():
    recs = [json.loads(line) for line in (FIXTURE / "trials.jsonl").read_text().splitlines()]
    v = study_verdict(recs, 13, 0)
    # one figure each: every phase pooled, as the issue's table sums them up
    assert (v.best.median, v.best.n) == (80.22, 5)
    assert (v.baseline.median, v.baseline.n) == (75.52, 5)
    assert v.verdict == SAME
    assert v.headline().startswith("The best configuration is not distinguishable from the "
                                   "strict fp32 baseline at this n")
    (fused,) = v.techniques
    assert fused.name == "fused" and fused.ratio == v.versus_baseline  # the same comparison
    assert fused.ratio.lo < 1 < fused.ratio.hi
    assert v.drift is not None and not v.drift.named


def test_a_lead_whose_every_technique_is_noise_is_held_back():
    # the best (two techniques) is clearly ahead of the baseline, but without either
    # technique one repeat ran within 1% of it: neither effect is beyond the noise alone
    best = [110, 111, 109, 112, 108, 110]
    runs = {"best": ({"a": {}, "b": {}}, best, None),
            "no-a": ({"b": {}}, [109, 104, 104, 106, 105, 104], "a"),
            "no-b": ({"a": {}}, [104, 110, 103, 106, 104, 105], "b"),
            "base": ({}, [100, 101, 99, 100, 102, 98], "")}
    recs, at = [], 0
    for rep in range(6):
        for tid, (cfg, rates, without) in runs.items():
            tags = ({"phase": "baseline"} if without == "" else
                    {"phase": "ablation", "ablation": {"of": "best-0", "without": without,
                                                       "repeat": rep}})
            recs.append(record(f"{tid}-{rep}", cfg, rates[rep], at, tags))
            at += 1
    v = study_verdict(recs, "best-0", "base-0")
    assert v.versus_baseline.verdict == FASTER
    assert [(t.name, t.ratio.method, t.ratio.verdict) for t in v.techniques] == [
        ("a", "paired", SAME), ("b", "paired", SAME)]
    assert v.held_back and v.verdict == SAME and "no speedup is claimed" in v.headline()
    # the tuner's summary prints the confirmation's ratio over the baseline held back too
    from training_harness.tune.final.results import _agreeing
    from training_harness.tune.final.summary import confirmation_text

    figure = {"median": 110.0, "min": 108.0, "max": 112.0, "n": 6}
    decision = {"best": "best-0", "median": 110.0, "n": 6, "indistinguishable": [],
                "standings": {"best-0": figure, "base-0": {**figure, "median": 100.0}},
                "baseline_id": "base-0", "baseline": {**figure, "median": 100.0},
                "versus_baseline": v.versus_baseline.as_dict()}
    line = confirmation_text(_agreeing(decision, v)).split("best: ")[1]
    assert "no speedup claimed at this n (held back" in line and "): faster" not in line
    # the headline gives the lead's own interval and why it is not claimed, not a tie
    assert v.headline().startswith("The best configuration measured 1.10x (95% interval")
    assert "none of its techniques beyond the noise alone" in v.headline()
    assert "not distinguishable" not in v.headline()


def test_too_few_measurements_for_an_interval_are_said_to_be_too_few_not_a_tie():
    """One measurement each of a 10x lead (the GPU proof's 150-s tune): no interval can
    reach 95%, so the verdict stays SAME for the logic, but the words say why."""
    once = ratio([470.0], [45.0])
    assert once.verdict == SAME and once.lo is None
    assert once.said == speedup.UNTOLD
    assert once.text().endswith("(no 95% interval at this n, 1 and 1 measurements): "
                                "too few measurements to tell")
    five = ratio([100, 101, 99, 100.5, 99.5], [100, 100.2, 99.8, 100.4, 99.6])
    assert five.lo is not None and five.said == five.verdict == SAME


def test_a_configuration_the_ablation_measured_above_the_best_is_said_so():
    """A 90-s quickstart tune here: the ablation's 'without fused' (bf16 alone) pooled
    to a higher median than the best the confirmation named (bf16 + fused), and topped
    the summary's table with nothing said; now a line says why and how they compare."""
    from training_harness.tune.final.summary import table

    ablation = [{"phase": "ablation", "ablation": {"of": "20", "without": "fused",
                                                   "repeat": i}} for i in range(2)]
    recs = [record(0, {}, 160, 0, {"phase": "baseline"}),
            record(13, {"amp": {}}, 205, 1), record(20, {"amp": {}, "fused": {}}, 229, 2),
            *[record(f"c{i}", {"amp": {}, "fused": {}}, 226 + i, 3 + i,
                     {"phase": "confirm", "confirm": {"of": "20", "round": i}})
              for i in range(3)],
            record("a0", {"amp": {}}, 248, 7, ablation[0]),
            record("a1", {"amp": {}}, 250, 8, ablation[1])]
    rows = table(recs, multi=False, best_id=20).splitlines()
    assert rows[1].split()[1] == "13" and rows[2].split()[1] == "20"
    assert rows[-1].startswith("  trial 13 ranks above the best named, trial 20, on "
                               "measurements the confirmation did not weigh")
    assert "3 and 4 measurements" in rows[-1]
    # the best on top: nothing to say
    assert "ranks above" not in table(recs, multi=False, best_id=13)
    assert "ranks above" not in table(recs[:6], multi=False, best_id=20)
