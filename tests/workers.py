"""How the suite shares its workers (pytest-xdist: `-n 3 --dist loadgroup` in pyproject;
pytest below 9 there, whose item ids xdist 3.8 can still suffix with the group).

Much of the suite waits (Slurm jobs, PostgreSQL, tuner budgets, torchrun's
rendezvous) rather than computes, so three workers overlap the waits on two cores: with
two, both cores stood idle for a fifth of the run's core-seconds (223 of 888 in a quiet
run on a 2-core Zen 4), with three for an eighth (111 of 806), and the run took 402 s
against 444.

- A module is the unit of scheduling, so its module fixtures are built once. Modules
  that share a costly session fixture (a launch, a study, a cluster) go to one worker
  together: SHARED names those fixtures, and the modules using one become one group.
- The long groups are scheduled first (FIRST: the Slurm group, which mostly waits on
  its cluster, then the launches and modules that compute the most, run beside it), so
  that none of them is the suite's tail. The modules that mostly wait on the real clock
  (WAITING) are spread through the rest, so that each runs beside modules that compute
  rather than beside another that waits (two waiting leave both cores idle).
- A test marked `alone` runs with no test of another worker beside it (the
  interference tests measure what other processes take). Every test holds a shared
  lock on a file while it runs; an `alone` test takes it exclusive. A turnstile taken
  before either keeps the `alone` test from waiting behind an endless run of others.
  A session fixture that spends a real budget once (the quickstart study: how many
  trials fit is what its tests check) runs that part `alone_now`; the tests that only
  read its output then run beside the other workers'.
- In each worker torch runs one intra-op thread (tests/conftest.py), and the processes
  the tests start get OMP_NUM_THREADS=1, except while an `alone` test (or block) runs.

Without xdist (`-n 0`, or `-p no:xdist`) nothing here changes the order, locks or threads.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

# Session fixtures that launch something costly, by the group their users share.
SHARED = {"local_slurm": "slurm", "two_node_slurm": "slurm",
          "parallel_records": "parallel-launch", "quickstart_study": "quickstart-study",
          "hung_two_ranks": "hung-ranks"}
# Scheduled first: the Slurm group (its jobs wait on the throwaway cluster, 0.7 of a core
# on average), then the groups that compute the most, which the other workers run beside
# it. Wall seconds (CPU seconds per wall second) in a quiet 2-worker run of f240ecd on a
# 2-core Zen 4 (2026-11-27).
FIRST = ("slurm",  # 240 (0.7): Slurm jobs on one throwaway cluster
         "quickstart-study",  # 115 (1.0), 45 of it alone
         "parallel-launch",  # 55 (1.2)
         "tests/export/test_verify.py",  # 29 (1.2)
         "tests/test_selftest_proof.py",  # 27 (1.0)
         "tests/test_cli.py",  # 23 (0.8)
         "tests/distributed/test_two_nodes.py")  # 8 (1.6)
# Modules that mostly wait on the real clock (a study's budget, a hung rank's timeout,
# a database restarted), longest first. Side by side they would leave both cores idle,
# so they are spread evenly through the rest of the suite, each beside modules that
# compute (their wall seconds and CPU seconds per wall second, as above).
WAITING = ("tests/tuner/test_postgres.py",  # 80 (0.4)
           "tests/tuner/test_chaos_workers.py",  # 29 (0.4)
           "tests/test_chaos_output.py",  # 27 (0.6)
           "hung-ranks",  # 27 (0.2)
           "tests/tuner/test_confirm.py",  # 24 (0.2)
           "tests/tuner/test_storage_outage.py",  # 23 (0.3)
           "tests/tuner/test_heartbeat_bridge.py",  # 9 (0.0)
           "tests/tuner/test_tuner_parts.py")  # 7 (0.1)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _group(item: pytest.Item, shared_by_module: dict[str, str]) -> str:
    module = _module(item)
    return shared_by_module.get(module, module)


def group_items(items: list[pytest.Item]) -> None:
    """Give every item an xdist_group (its module's, or its shared fixture's), and order
    the groups: FIRST's, then the rest with WAITING's spread evenly among them, keeping
    the order within each group."""
    shared_by_module: dict[str, str] = {}
    for item in items:
        module = _module(item)
        if module.startswith("tests/slurm/"):
            shared_by_module[module] = "slurm"
        for name in getattr(item, "fixturenames", ()):
            if name in SHARED:
                # A module using two shared fixtures joins the first one met.
                shared_by_module.setdefault(module, SHARED[name])
    by_group: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group(item, shared_by_module)
        item.add_marker(pytest.mark.xdist_group(group))
        by_group.setdefault(group, []).append(item)
    items[:] = [item for group in _order(list(by_group), {g: len(i) for g, i in by_group.items()})
                for item in by_group[group]]


def _order(groups: list[str], sizes: dict[str, int]) -> list[str]:
    """FIRST's groups, then the others in collection order, with WAITING's k-th group
    placed after k equal shares of their tests (the first at once)."""
    first = [g for g in FIRST if g in sizes]
    waiting = [g for g in WAITING if g in sizes]
    rest = [g for g in groups if g not in first and g not in waiting]
    share = sum(sizes[g] for g in rest) / max(len(waiting), 1)
    ordered, seen, placed = list(first), 0, 0
    for group in rest:
        while placed < len(waiting) and seen >= share * placed:
            ordered.append(waiting[placed])
            placed += 1
        ordered.append(group)
        seen += sizes[group]
    return ordered + waiting[placed:]


def _lock_folder() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "solo")
    folder = Path(tempfile.gettempdir()) / f"harness-suite-{run}"
    folder.mkdir(exist_ok=True)
    return folder


_set_here: dict[str, str] = {}  # what one_thread_for_processes set, to lift and restore
_held = threading.local()  # the running test's lock files and whether it is alone


def one_thread_for_processes() -> None:
    """Processes the tests start (a trial, a rank server, a Slurm job) run torch with one
    intra-op thread, as torchrun's ranks do: beside the other workers a second thread only
    spin-waits (8% of the CPU of the subprocess-heavy modules, measured side by side). A
    value the user set stays."""
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = _set_here["OMP_NUM_THREADS"] = "1"


@contextmanager
def _all_threads() -> Iterator[None]:
    """An `alone` test has both cores: its processes choose their threads as a user's."""
    for name in _set_here:
        os.environ.pop(name, None)
    try:
        yield
    finally:
        os.environ.update(_set_here)


@contextmanager
def turn(alone: bool) -> Iterator[None]:
    """Hold the suite's lock for one test: shared, or exclusive when `alone`."""
    folder = _lock_folder()
    with open(folder / "turnstile", "a") as turnstile, open(folder / "running", "a") as running:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        _held.turn = (turnstile, running, alone)
        try:
            with _all_threads() if alone else nullcontext():
                yield
        finally:
            _held.turn = None
            fcntl.flock(running, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextmanager
def alone_now() -> Iterator[None]:
    """Within a test's shared turn: this block alone, as an `alone` test would run. The
    shared lock is let go first, so an `alone` test of another worker already waiting
    goes before it (holding it while taking the turnstile could deadlock with that one)."""
    turnstile, running, alone = getattr(_held, "turn", None) or (None, None, True)
    if alone:  # not within a turn (no xdist), or alone already
        yield
        return
    fcntl.flock(running, fcntl.LOCK_UN)
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(running, fcntl.LOCK_EX)
        with _all_threads():
            yield
    finally:
        fcntl.flock(running, fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)


def under_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config, "workerinput", None)) or bool(
        config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None))
