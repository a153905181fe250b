"""A configuration's line shows every setting that tells it apart: its main settings, those
that differ from their defaults (the tune's lines), and those that differ between the rows
of a table (the summary, `harness plan`)."""

from __future__ import annotations

from training_harness.records.plan_text import describe_plan, differing, varying

SELECTIVE = {"strategies": {"checkpoint": {"every": 1, "policy": "selective"},
                            "fused": {"attention": "sdpa", "optimizer": "fused",
                                      "compile": True, "compile_mode": "reduce-overhead"}}}
WHOLE = {"strategies": {"checkpoint": {"every": 1, "policy": "full"},
                        "fused": {"attention": "sdpa", "optimizer": "fused", "compile": True,
                                  "compile_mode": "default"}}}
DEFAULTS = {"checkpoint": {"every": 1, "policy": "full"},
            "fused": {"attention": "sdpa", "optimizer": "fused", "compile": False,
                      "compile_mode": "default"}}


def test_the_main_settings_alone_read_the_same_for_two_configurations():
    assert describe_plan(SELECTIVE) == describe_plan(WHOLE)  # what the issue saw


def test_a_setting_off_its_default_is_shown():
    line = describe_plan(SELECTIVE, differing(SELECTIVE, DEFAULTS))
    assert "checkpoint(every=1, policy=selective)" in line
    assert "compile_mode=reduce-overhead" in line
    whole = describe_plan(WHOLE, differing(WHOLE, DEFAULTS))
    assert "policy" not in whole and "compile_mode" not in whole  # the defaults stay quiet
    assert line != whole


def test_a_setting_that_differs_between_rows_is_shown_in_each():
    differ = varying([SELECTIVE, WHOLE])
    assert differ == {"checkpoint": {"policy"}, "fused": {"compile_mode"}}
    assert "policy=full" in describe_plan(WHOLE, differ)
    assert "policy=selective" in describe_plan(SELECTIVE, differ)
    assert varying([WHOLE, WHOLE]) == {"checkpoint": set(), "fused": set()}
