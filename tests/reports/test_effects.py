"""What each technique bought: from leave-one-out records, or from pairs of trials."""

from __future__ import annotations

import copy

import pytest

from tests.reports.runs import GiB, synthetic_records, write_run
from training_harness.reports.effects import technique_effects
from training_harness.reports.headline import headline
from training_harness.reports.load import load_run


def _ablation(base: dict, tid: int, without: str | None, thr: float, mem: float,
              status: str = "ok", repeat: int = 0) -> dict:
    r = copy.deepcopy(base)
    r["plan"]["strategies"].pop(without, None)
    tags = {"phase": "ablation", "ablation": {"of": 1, "without": without, "repeat": repeat}}
    r.update(trial_id=tid, status=status, reason=None if status == "ok" else "out of memory",
             tags=tags)
    r["metrics"]["samples_per_s"] = thr if status == "ok" else None
    r["metrics"]["peak_memory_bytes"] = mem if status == "ok" else None
    return r


@pytest.fixture
def study(tmp_path):
    """Best trial 1 (amp + checkpoint + fused) with hand-made leave-one-out trials."""
    recs = synthetic_records(2, ablation=False)
    best = recs[1]
    best["plan"]["strategies"] = {"amp": {"dtype": "bf16"}, "checkpoint": {"every": 1},
                                  "fused": {}}
    abl = []
    for i, thr in enumerate((100.0, 102.0, 98.0, 101.0)):   # the best, re-measured
        abl.append(_ablation(best, 10 + i, None, thr, 4 * GiB, repeat=i))
    for i, thr in enumerate((50.0, 51.0, 49.0, 50.5)):      # without amp: half as fast
        abl.append(_ablation(best, 20 + i, "amp", thr, 6 * GiB, repeat=i))
    for i, thr in enumerate((99.0, 103.0, 100.0, 101.5)):   # without fused: noise
        abl.append(_ablation(best, 30 + i, "fused", thr, 4 * GiB, repeat=i))
    for i in range(4):                                       # without checkpoint: oom
        abl.append(_ablation(best, 40 + i, "checkpoint", 0, 0, status="oom", repeat=i))
    return load_run(write_run(tmp_path / "s", recs + abl, journal=False))


def test_effects_from_ablation_have_median_spread_and_verdict(study):
    eff = technique_effects(study)
    assert eff.source == "ablation"
    by = {e.technique: e for e in eff.items}
    assert set(by) == {"amp", "checkpoint", "fused"}
    amp = by["amp"]
    # the best's configuration pooled: its search trial (about 240 samples/s) and its four
    # re-measurements, against the four without amp: the Hodges-Lehmann ratio and interval
    assert amp.speedup == pytest.approx(2.0, rel=0.02) and amp.ratio.method == "pooled"
    assert 98 / 51 <= amp.speedup_lo < amp.speedup < amp.speedup_hi
    assert amp.memory_saved == pytest.approx(2 * GiB)
    assert amp.clear is True and amp.n == 4 and amp.n_reference == 5
    assert "+10" in amp.verdict and amp.verdict.endswith(": faster")
    fused = by["fused"]
    assert fused.clear is False and "not distinguishable at this n" in fused.verdict
    assert fused.speedup_lo < 1 < fused.speedup_hi
    ckpt = by["checkpoint"]
    assert ckpt.speedup is None and ckpt.failures == {"oom": 4}
    assert "needed" in ckpt.verdict and "oom ×4" in ckpt.verdict


def test_headline_pools_the_best_repeats(study):
    h = headline(study)
    assert sorted(h.repeats) == [98.0, 100.0, 101.0, 102.0]
    # the search figure of the best (about 240 samples/s) is one of five: the pooled
    # median is the re-measurements', and the spread shows the lucky one
    best = h.study.best
    assert best.n == 5 and best.median == 101.0 and best.hi > 200
    assert best.phases == {"known-good": 1, "ablation": 4}


def test_effects_fall_back_to_pairs_of_search_trials(tmp_path):
    recs = synthetic_records(3, ablation=False)
    base = recs[0]
    with_amp = copy.deepcopy(base)
    with_amp.update(trial_id=5, tags={"phase": "search"})
    with_amp["plan"]["strategies"] = {"amp": {"dtype": "bf16"}}
    with_amp["metrics"]["samples_per_s"] = base["metrics"]["samples_per_s"] * 1.5
    with_amp["metrics"]["peak_memory_bytes"] = base["metrics"]["peak_memory_bytes"] - GiB
    run = load_run(write_run(tmp_path / "s", [*recs, with_amp], journal=False))
    eff = technique_effects(run)
    assert eff.source == "pairs" and "differ only in that technique" in eff.note
    (amp,) = [e for e in eff.items if e.technique == "amp"]
    assert amp.speedup == pytest.approx(1.5) and amp.memory_saved == pytest.approx(GiB)
    assert amp.clear is None and "spread unknown" in amp.verdict


def test_no_effects_says_why(tmp_path):
    run = load_run(write_run(tmp_path / "s", synthetic_records(1), journal=False))
    eff = technique_effects(run)
    assert eff.source == "none" and not eff.items and "cannot be shown" in eff.note


@pytest.mark.parametrize("best_has_techniques", [False, True])
def test_ablation_with_nothing_turned_off_says_why(tmp_path, best_has_techniques):
    """Only the best re-measured: either it uses no technique (the fp32 baseline won, as
    it can on a CPU), or the study stopped before the leave-one-out trials ran."""
    recs = synthetic_records(2, ablation=False)
    best = recs[1]
    best["plan"]["strategies"] = {"amp": {"dtype": "bf16"}} if best_has_techniques else {}
    best["metrics"]["samples_per_s"] = 1e9  # the best, whatever the generator drew
    abl = [_ablation(best, 10 + i, None, 100.0 + i, 4 * GiB) for i in range(2)]
    eff = technique_effects(load_run(write_run(tmp_path / "s", recs + abl, journal=False)))
    assert eff.source == "ablation" and not eff.items
    if best_has_techniques:
        assert eff.note.startswith("No leave-one-out trial of trial 1")
    else:
        assert eff.note.startswith("The best configuration (trial 1) uses no technique")
