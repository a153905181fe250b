"""The search's first guesses (training_harness.tune.search.first_guesses.first_tier): the
estimator's
ties are measured, in a seeded order, within a share of the space."""

from training_harness.tune.search.first_guesses import CAP, START, first_tier, tier_limit


def _scored(rates):
    return [(rate, {"i": i}) for i, rate in enumerate(rates)]


def test_the_estimators_tie_is_queued_whole_and_nothing_slower():
    scored = _scored([100, 99, 98, 97, 96, 96, 80, 79, 60, 50] + [10] * 30)
    picked = first_tier(scored, size=40, seed=0)
    assert sorted(p["i"] for p in picked) == [0, 1, 2, 3, 4, 5]


def test_a_short_tie_is_topped_up_with_the_next_fastest():
    picked = first_tier(_scored([100, 70, 60, 50, 40, 30, 20]), size=40, seed=0)
    assert [p["i"] for p in picked] == list(range(START))


def test_the_tie_is_capped_by_the_space_and_by_cap():
    tie = _scored([100] * 40)
    assert len(first_tier(tie[:12], size=12, seed=0)) == max(START, 12 // 2)
    assert len(first_tier(tie, size=400, seed=0)) == CAP


def test_the_order_within_the_tie_is_seeded():
    tie = _scored([100] * 10)
    assert first_tier(tie, 40, seed=1) == first_tier(tie, 40, seed=1)
    orders = {tuple(p["i"] for p in first_tier(tie, 40, seed=s)) for s in range(5)}
    assert len(orders) > 1


def test_the_limit_is_half_a_small_space_between_start_and_cap():
    assert [tier_limit(n) for n in (4, 12, 20, 400, None)] == [START, 6, 10, CAP, CAP]


def test_nothing_predicted_nothing_queued():
    assert first_tier([], size=10, seed=0) == []
