"""The vision zoo's table holds (docs/benchmarks/zoo_vision_cpu_2026-11-24.md, made by
tests/workloads/zoo_vision.py): every row is ok or refused in one line, none failed; a
model ok there stays ok. Every run tries the fixed sample FAST (about 20 s); the whole
list is marked slow and runs only with HARNESS_ZOO_FULL=1 (minutes: CI's suite leaves it
out)."""

from __future__ import annotations

import os

import pytest

from tests.workloads import zoo_vision
from tests.workloads.tiny_hf import needs_torchvision


def _zoo_ready() -> None:
    needs_torchvision()
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import optional

    try:
        optional.require("timm", "timm")
    except HarnessError as e:
        pytest.skip(str(e))


def test_the_committed_table_has_no_failure_and_one_line_refusals():
    rows = zoo_vision.read_table()
    assert set(rows) == set(zoo_vision.MODELS)  # the table is the list's, whole
    assert all(result in ("ok", "refused") for result, _ in rows.values()), rows
    assert set(zoo_vision.FAST) <= {m for m, (r, _) in rows.items() if r == "ok"}


def _holds(name: str) -> None:
    expected, row = zoo_vision.read_table()[name]
    got = zoo_vision.try_model(name)
    assert got.result != "failed", f"{name}: {got.detail}"
    assert "\n" not in got.detail, got.detail
    if expected == "ok":
        assert got.result == "ok", f"{name} was ok in the table, now: {got.detail}"
        assert got.blocks in row  # checkpointed on the same blocks


@pytest.mark.parametrize("name", zoo_vision.FAST)
def test_a_sample_of_the_zoo_still_trains(name):
    _zoo_ready()
    _holds(name)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HARNESS_ZOO_FULL"),
                    reason="the whole vision zoo (minutes): set HARNESS_ZOO_FULL=1")
@pytest.mark.parametrize("name", [m for m in zoo_vision.MODELS if m not in zoo_vision.FAST])
def test_the_whole_zoo_still_trains(name):
    _zoo_ready()
    _holds(name)
