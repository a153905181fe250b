"""Shared pytest hooks: `gpu`-marked tests are skipped where no CUDA device is visible,
and the xdist workers share the suite as tests/workers.py says."""

from __future__ import annotations

import gc

# Collection imports torch, transformers, timm and the rest with the cyclic collector
# paused, as the rank server's preload does (training_harness.measure.rank_preload): 4 of each
# worker's 9 CPU-s of collection, measured. It is back on once the tests are collected.
gc.disable()

import os  # noqa: E402
import sys  # noqa: E402

# Compiled once. Where PYTHONDONTWRITEBYTECODE is set (many container images set it),
# each of the 300-odd interpreters the suite starts (ranks, servers, tuners, torchrun's
# agents) would compile the harness's modules again, about 0.1 CPU-s each, and each
# worker would rewrite every test module's asserts: the suite's processes write their
# bytecode as Python does by default, in __pycache__ beside the sources (.gitignore).
# (PYTHONPYCACHEPREFIX would keep it out of the checkout, but it moves every module's
# cache there, torch's included, all compiled anew.)
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

import training_harness  # noqa: E402, F401  (mends torchvision's import: training_harness.core.torchvision_ops)
from tests import workers  # noqa: E402
from training_harness.launch import rank_server  # noqa: E402

# That mend matters in xdist's controller too: to show a worker's warning it imports the
# warning class's module (lightning's, which imports torchvision).

# A test process has one rank server (multiprocessing's forkserver), started by
# whichever test needs it first. An in-process `harness tune` with the fake launcher
# would start it with the helper's preload alone (its trials are not forked), and the
# ranks that later tests fork from it would each import torch._dynamo and the trial
# loop: here the server always gets the trials' preload. (tests/tuner/
# test_helper_preload.py checks the helper's own, in processes of their own.)
rank_server.HELPER_PRELOAD = rank_server.PRELOAD + rank_server.STUDY_PRELOAD


def _collector_back_on() -> None:
    gc.freeze()  # what the imports made stays out of every later collection
    gc.enable()


def pytest_collection_finish(session: pytest.Session) -> None:
    _collector_back_on()


def pytest_unconfigure(config: pytest.Config) -> None:
    # Frozen, the imports' objects would meet the interpreter's exit uncollected, and
    # triton's extension (nanobind) would print pages of leak warnings. Under xdist the
    # workers' stderr is not shown and the controller imports no triton: they skip the
    # exit's collection (2.7 CPU-s).
    if not workers.under_xdist(config):
        gc.unfreeze()


def pytest_configure(config: pytest.Config) -> None:
    if workers.under_xdist(config) and getattr(config, "workerinput", None) is None:
        _collector_back_on()  # xdist's controller: it collects nothing
    # The workers share the cores: torch's second intra-op thread in each would only
    # spin-wait for a core another worker holds (2-4x the CPU time of a small in-process
    # training test, measured). The processes the tests start get one thread too, except
    # beside an `alone` test (tests/workers.py).
    if getattr(config, "workerinput", None) is not None:
        torch.set_num_threads(1)
        workers.one_thread_for_processes()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if workers.under_xdist(config):
        workers.group_items(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not workers.under_xdist(item.config):
        return (yield)
    with workers.turn(alone=item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.fixture(scope="session")
def parallel_records(tmp_path_factory: pytest.TempPathFactory):
    """`get(family)`: each rank's records of a family of parallel cases
    (tests/distributed/run_case.py; "hf" is tests/workloads/run_hf_case.py's), by rank.
    The families on as many ranks run in one torchrun launch, once per session, shared
    by tests/distributed/test_parallel_strategies.py and tests/test_workloads_hf_parallel.py:
    a launch costs an interpreter per rank importing torch and a gloo group."""
    from tests.distributed.run_case import launch_families, same_ranks

    launched: dict[tuple[str, ...], dict[int, dict]] = {}

    def get(family: str) -> dict[int, dict]:
        group = same_ranks(family)
        if group not in launched:
            out = tmp_path_factory.mktemp("parallel-" + "-".join(group))
            launched[group] = launch_families(group, out)
        return launched[group]

    return get


@pytest.fixture(scope="session")
def quickstart_study(tmp_path_factory: pytest.TempPathFactory):
    """The README's main job, for real: `harness tune studies/quickstart.toml` on this CPU
    with a 20-second budget (trials in their own processes), run once per session and
    shared by the tests that check the study (tests/tuner/test_tune_processes.py) and
    the report drawn from it (tests/reports/test_chromium.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    out, budget = tmp_path_factory.mktemp("quickstart") / "run", 20
    # Other work on this machine would flag every trial (tests/test_interference.py
    # covers that): here the flow is under test, so busy figures count.
    # It runs with no test of another worker beside it (tests/workers.py); the tests
    # that then read its output need not.
    with workers.alone_now():
        env = {**os.environ, "HARNESS_QUIET_SHARE": "1"}
        proc = subprocess.run([sys.executable, "-m", "training_harness", "tune",
                               "studies/quickstart.toml", "--out", str(out), "--budget",
                               f"{budget}s"], cwd=Path(__file__).resolve().parents[1],
                              env=env, capture_output=True, text=True,
                              timeout=budget * 6)  # a hang guard
    return SimpleNamespace(out=out, budget=budget, proc=proc)


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server per session (tests/pg_server.py); its `postgres` fixture gives
    each test a fresh database on it."""
    from tests.pg_server import server_for_session

    yield from server_for_session()

