"""Trials in flight at once (a launcher with max_jobs, as the Slurm launcher's), with the
fake launcher: no processes, no Slurm (tests/slurm runs the real thing)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.tuner import fake_jobs
from tests.tuner.conftest import records, write_study
from training_harness.cli.main import main
from training_harness.core.plan import Plan
from training_harness.launch.jobs_in_flight import InFlight
from training_harness.strategies.compose import resolved
from training_harness.study.search_space import config_key

JOBS = "tests.tuner.fake_jobs:launch"


@pytest.fixture(autouse=True)
def fresh():
    fake_jobs.reset()
    yield
    fake_jobs.reset()


def tune(*args: str) -> int:
    return main(["tune", *args, "--launcher", JOBS, "--quiet"])


def test_two_trials_run_at_once_and_every_one_is_recorded_once(tmp_path, launched):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 1, "confirm_repeats": 1})
    assert tune(str(path), "--out", str(out), "--n-trials", "8") == 0
    assert sorted(fake_jobs.ENDED[:2]) == [(0, "ok"), (1, "ok")]  # they met: both in flight
    recs = records(out)
    search = [r for r in recs if r["tags"]["phase"] in ("baseline", "known-good", "search")]
    assert len(search) == 8 and len({r["trial_id"] for r in recs}) == len(recs)
    # nothing searched twice: a configuration proposed while in flight waits for its record
    searched = [c["plan"] for c in launched if isinstance(c["trial_id"], int)]
    assert len(searched) == len({config_key(resolved(Plan.from_dict(p))) for p in searched})
    assert (out / "best.toml").exists()


def test_sigterm_stops_every_trial_in_flight_and_records_none(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRIAL_S", "300")  # 1 s a step, to their timeout: stopped first
    started = []

    def hold(trial_id):
        started.append(trial_id)
        if len(started) == 2:  # both in flight: stop the tuner, as `scancel` of its job does
            os.kill(os.getpid(), signal.SIGTERM)

    fake_jobs.HOLD = hold
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    assert tune(str(write_study(tmp_path, steps=300)), "--out", str(out)) == 130
    assert sorted(fake_jobs.ENDED) == [(0, "KeyboardInterrupt"), (1, "KeyboardInterrupt")]
    assert not (out / "trials.jsonl").exists() or not records(out)  # --resume settles them
    assert signal.getsignal(signal.SIGTERM) is before
    assert not [t for t in threading.enumerate() if t.name.startswith("trial-")]


def test_an_error_in_one_trial_stops_the_others_and_is_raised():
    stopped = []

    def until_stopped():  # as a launcher polls its job: should_stop at every poll
        stop = pool.guard(None)
        try:
            while True:
                stop()
                time.sleep(0.05)
        except KeyboardInterrupt:
            stopped.append(True)
            raise

    with pytest.raises(ZeroDivisionError), InFlight(2) as pool:
        pool.start(until_stopped)
        pool.start(lambda: 1 / 0)
        pool.drain()
    assert pool.stopping.is_set() and not pool.running and stopped == [True]


def test_a_limit_of_one_runs_each_trial_here():
    here = threading.current_thread()
    with InFlight(1) as pool:
        pool.start(lambda: threading.current_thread() is here)
        assert pool.ended() == [True] and pool.guard(None) is None
