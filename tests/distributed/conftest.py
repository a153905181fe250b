"""Shared set-up of the launcher's tests: one hanging 2-rank trial for the whole session."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from tests.distributed.launch_helpers import ROOT, faulty_plan, launch_plan

HANG_TIMEOUT_S = 20.0


@pytest.fixture(scope="session")
def hung_two_ranks(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A 2-rank trial whose rank 1 sleeps for ever in its loss, stopped by the launcher
    at its timeout on the real clock: run once, its record and folder shared
    by tests/distributed/test_launch.py and test_fork_ranks.py (their two trials were
    the same one, and each waited the whole timeout)."""
    out = tmp_path_factory.mktemp("hung") / "hang"
    with contextlib.chdir(ROOT):  # the trial imports tests.faulty_workload from there
        result = launch_plan(faulty_plan(hang_rank=1, timeout_s=HANG_TIMEOUT_S), out, "test")
    return SimpleNamespace(result=result, out=out, timeout=HANG_TIMEOUT_S)
