"""Shared pieces of the launcher's tests: tiny plans, and the check that nothing survives."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from training_harness.core.plan import Layout, Plan
from training_harness.launch import rank_server
from training_harness.strategies import registry

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(layers=2, heads=2, hidden=32, seq_len=16, vocab=64)


def needs_ddp() -> None:
    if "ddp" not in {s.name for s in registry.all_strategies()}:
        pytest.skip("needs the ddp strategy (strategies/ddp.py): a 2-rank plan is refused "
                    "without a distributed strategy")


def faulty_plan(world: int = 2, timeout_s: float = 180.0, steps: int = 3, **faults) -> Plan:
    """A tiny GPT that fails as `faults` say, on `world` data-parallel ranks (ddp). The
    deadline is a ceiling, not a test of speed: a trial of two ranks took 9 s alone and
    passed 60 s once in CI's whole suite (three workers on two cores); a test of the
    deadline itself gives its own."""
    if world > 1:
        needs_ddp()
    return Plan(
        name="faulty",
        workload="tests.faulty_workload:build",
        workload_args={**TINY, **faults},
        device="cpu",
        layout=Layout(data=world),
        micro_batch_size=4,
        strategies={"ddp": {}} if world > 1 else {},
        warmup_steps=1,
        steps=steps,
        timeout_s=timeout_s,
    )


def survivors(out_dir: Path) -> list[psutil.Process]:
    """Live processes started for the trial in `out_dir`: children of this process, or
    any process with the folder in its command line."""
    found = {}
    for p in psutil.Process().children(recursive=True):
        found[p.pid] = p
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and str(out_dir) in " ".join(p.info["cmdline"] or []):
            found[p.pid] = p
    alive = []
    for p in found.values():
        try:
            cmdline = " ".join(p.cmdline())
            if "training_harness.measure.torch_helper_server" in cmdline \
                    or p.name() == rank_server.HELPER_NAME:
                continue  # this process's torch-side helper, no trial's
            if p.ppid() == os.getpid() and ("multiprocessing.forkserver" in cmdline
                                            or "multiprocessing.resource_tracker" in cmdline):
                continue  # the rank server itself (training_harness.launch.rank_server), not a rank
                # forked from it: those are its children, and count
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def assert_nothing_left(out_dir: Path) -> None:
    deadline = time.monotonic() + 2  # a process may take a moment to be reaped
    while survivors(out_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(p.pid, " ".join(p.cmdline())[:200]) for p in survivors(out_dir)]
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def in_repo_root(monkeypatch):
    """The trial imports tests.faulty_workload from the working folder."""
    monkeypatch.chdir(ROOT)


def timeout_once_hung(monkeypatch: pytest.MonkeyPatch, marks: Path, timeout_s: float) -> None:
    """The launcher's clock (training_harness.launch.local's time.monotonic) jumps `timeout_s`
    ahead once a rank of the trial is in its hang (tests/faulty_workload.py touches a
    file in `marks`): the trial's deadline passes there and then, as it would have
    `timeout_s` after the start, without waiting for it however long the rank took to
    get there. What follows is the launcher's own: the stacks asked for, the ranks
    stopped, the record. (tests/distributed/conftest.py's hung trial waits on the real
    clock.)"""
    from tests.faulty_workload import HANG_MARK_ENV
    from training_harness.launch import local

    marks.mkdir()
    monkeypatch.setenv(HANG_MARK_ENV, str(marks))

    def monotonic() -> float:
        return time.monotonic() + (timeout_s if any(marks.iterdir()) else 0.0)

    clock = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    clock.monotonic = monotonic
    monkeypatch.setattr(local, "time", clock)


def launch_plan(plan: Plan, out: Path | str, command: str, **kwargs):
    """training_harness.launch.local.launch on `plan` checked here (as `harness bench` does)."""
    from training_harness.launch.local import launch
    from training_harness.measure.prepare import prepare

    return launch(prepare(plan).checked(), out, command, **kwargs)
