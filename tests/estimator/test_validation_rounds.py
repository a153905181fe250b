"""The estimator validation's rounds (tests/benchmarks/estimator_validation.py): a plan's
error is the median of its rounds' errors, each round's estimate against that round's
trial; the page's summary reads those medians. Synthetic rows: nothing is measured."""

from __future__ import annotations

import pytest

from tests.benchmarks.estimator_validation import combine_rounds, errors, summary


def one(plan: str, measured: float, predicted: float, plain: float = 1.0) -> dict:
    return {"plan": plan, "status": "ok", "measured": measured, "predicted": predicted,
            "plain": plain, "samples_per_step": 8, "interference": False,
            "matmul": 200.0, "load": 1.0}


def test_a_plans_error_is_the_median_of_its_rounds():
    # an allocator's two modes: the trial lands in the slow one once in three rounds
    rounds = [one("mlp", 0.030, 0.029), one("mlp", 0.045, 0.030), one("mlp", 0.029, 0.028)]
    row = combine_rounds(rounds)
    assert row["measured"] == pytest.approx(0.030)
    assert row["predicted_error"] == pytest.approx(0.028 / 0.029 - 1)  # the middle round's
    assert errors([row], "predicted") == [row["predicted_error"]]
    assert row["rounds"] == rounds and not row["interference"]


def test_a_round_without_a_figure_is_left_out_and_busy_is_kept():
    rounds = [one("vit", 0.40, 0.44), {**one("vit", 0.0, 0.4), "measured": None},
              {**one("vit", 0.50, 0.45), "interference": True}]
    row = combine_rounds(rounds)
    assert row["measured"] == pytest.approx(0.45)
    assert row["predicted_error"] == pytest.approx(((0.44 / 0.40 - 1) + (0.45 / 0.50 - 1)) / 2)
    assert row["interference"]


def test_the_summary_reads_the_rounds_medians():
    rows = [combine_rounds([one("a", 1.0, 1.1), one("a", 1.0, 0.9), one("a", 1.0, 1.0)]),
            combine_rounds([one("b", 2.0, 1.6), one("b", 2.0, 1.7), one("b", 2.0, 1.5)])]
    text = summary(rows, "predicted")
    # a's rounds +10%, -10%, 0%: 0%; b's -20%, -15%, -25%: -20%
    assert text.startswith("median 10.0%, p90 20.0%, max 20.0% (n=2)")
