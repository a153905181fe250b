"""Helpers for the tuner's tests: study files made from the quickstart study, and
`harness tune` run in this process with the fake launcher (tests/tuner/fake_launch.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.tuner import fake_launch
from training_harness.cli.main import main
from training_harness.records.tags import PRUNED_SLOW, tags_of

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "studies" / "quickstart.toml"
FAKE = "tests.tuner.fake_launch:launch"
# a budget table for tests of the search alone: no confirmation rounds, no ablation
SEARCH_ONLY = {"ablation_repeats": 0, "confirm_repeats": 0}


def study_table(**changes: Any) -> dict[str, Any]:
    """The quickstart study with `changes` merged in (tables merge one level deep)."""
    table = tomllib.loads(QUICKSTART.read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(table.get(key), dict):
            table[key] = {**table[key], **copy.deepcopy(value)}
        else:
            table[key] = copy.deepcopy(value)
    return table


def write_study(folder: Path, table: dict[str, Any] | None = None, **changes: Any) -> Path:
    path = folder / "study.toml"
    path.write_text(tomli_w.dumps(table if table is not None else study_table(**changes)))
    return path


def tune(*args: str) -> int:
    """`harness tune ARGS --launcher fake --quiet` in this process."""
    return main(["tune", *args, "--launcher", FAKE, "--quiet"])


def tune_process(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """`harness tune ARGS` with the fake launcher, as its own process."""
    import os

    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "training_harness", "tune", *args, "--launcher",
                             FAKE],
                            cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines()
            if line.strip()]


def measured(record: dict[str, Any]) -> bool:
    """The trial ran and was measured: to the end, or until it was stopped early for
    being slow (a retried configuration may be, once the search found faster ones)."""
    return record["status"] == "ok" or tags_of(record).get("pruned") == PRUNED_SLOW


def same_configuration(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two records' plans are one configuration (names and filled-in defaults aside)."""
    from training_harness.core.plan import Plan
    from training_harness.strategies.compose import resolved
    from training_harness.study.search_space import config_key

    return config_key(resolved(Plan.from_dict(a))) == config_key(resolved(Plan.from_dict(b)))


@pytest.fixture
def launched():
    """What the fake launcher launched during the test."""
    fake_launch.CALLS.clear()
    yield fake_launch.CALLS
    fake_launch.CALLS.clear()


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The fake launcher runs nothing: whether this machine is busy while a test runs
    says nothing of its trials, so early stopping is not held back by it."""
    from training_harness.core import interference as quiet

    monkeypatch.setattr(quiet.BusyWatch, "__call__", lambda self: False)


@pytest.fixture(autouse=True)
def no_claim_pause(monkeypatch):
    """An in-process study is the only worker of its storage: nobody else's claim on the
    final phases can land while it pauses (training_harness.tune.final.phases.CLAIM_PAUSE_S), so
    it claims without the 1 s pause. Studies of several workers run as processes of their
    own (test_tune_processes.py, test_postgres.py, test_chaos_workers.py), with it."""
    from training_harness.tune.final import phases

    monkeypatch.setattr(phases, "CLAIM_PAUSE_S", 0.0)


# The MFU denominators every in-process study here fixes at its start (the torch-side
# helper's MachineFacts.peaks, which study.json keeps and every prepare divides by): the
# same figure for every dtype, on every machine. The estimator's step times, and so the
# trial times the tuner expects and skips by, then come from the test alone. Measured
# here they would not: bf16 runs about 30x slower than fp32 on a CPU with AVX2 and no
# AVX-512 BF16, and the tuner skipped a fake study's amp configurations as too slow.
FIXED_PEAK_FLOPS = 1e11
FIXED_PEAK_SOURCE = "fixed: tests/tuner/conftest.py (the same on every machine)"


def fixed_peak(record: dict[str, Any]) -> dict[str, Any]:
    """A PeakChoice record (training_harness.measure.peaks) of FIXED_PEAK_FLOPS."""
    peak = {"flops": FIXED_PEAK_FLOPS, "source": FIXED_PEAK_SOURCE}
    return {**record, "datasheet": None, "measured": peak, "used": "measured",
            "flops": FIXED_PEAK_FLOPS, "source": FIXED_PEAK_SOURCE,
            "reason": "fixed by the tests, so that none depends on this CPU's measured peaks"}


@pytest.fixture(autouse=True)
def fixed_peaks(monkeypatch):
    """In-process studies take FIXED_PEAK_FLOPS as their peaks (the helper answers the
    rest as usual). A study in a process of its own measures them, as a user's does."""
    from training_harness.launch.torch_helper import TorchHelper

    real = TorchHelper.study_facts

    def study_facts(self, study):
        facts = real(self, study)
        facts.peaks = {dtype: fixed_peak(record) for dtype, record in facts.peaks.items()}
        return facts

    monkeypatch.setattr(TorchHelper, "study_facts", study_facts)
