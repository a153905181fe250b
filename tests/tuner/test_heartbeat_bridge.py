"""A trial beats from the moment ask() creates it, not only once the tuner holds it: the
sampler chooses inside ask(), which on a loaded machine can outlast the grace period, and
another worker must not take the trial for dead meanwhile (seen in CI: PostgreSQL, three
workers, `UpdateFinishedTrialError` from the sampler's before_trial). SQLite stands in for
the shared database; the sampler is a slow one."""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState

from training_harness.study.storage_spec import StorageSpec
from training_harness.tune.storage import (
    Heartbeat,
    StorageHooks,
    fail_stale_trials,
    make_storage,
)


class SlowSampler(optuna.samplers.RandomSampler):
    def before_trial(self, study, trial):
        time.sleep(3.5)  # longer than the grace below: the trial must still be alive after


def test_a_trial_beats_while_the_sampler_chooses_and_until_its_heartbeat_takes_over(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = make_storage(url, tmp_path, StorageSpec(heartbeat=1, grace=2),
                           hooks=StorageHooks(stamp={"worker": "here"}))
    failed = []  # what the other worker's stale-trial hook (resume.StaleTrials) is given
    other = make_storage(url, tmp_path, StorageSpec(heartbeat=1, grace=2),  # another worker
                         hooks=StorageHooks(on_stale=lambda s, t: failed.append(t.number)))
    try:
        study = optuna.create_study(study_name="s", storage=storage, sampler=SlowSampler())
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        seen = optuna.load_study(study_name="s", storage=other)
        fail_stale_trials(seen, other)
        assert study.trials[0].state == TrialState.RUNNING  # not taken for dead
        with Heartbeat(storage, trial._trial_id):  # the tuner's own beats take over
            assert trial._trial_id not in storage._bridges
            time.sleep(2.5)
            fail_stale_trials(seen, other)
            assert study.trials[0].state == TrialState.RUNNING
        time.sleep(3)  # no beat at all now: the trial goes stale, as a dead worker's does
        fail_stale_trials(seen, other)
        assert study.trials[0].state == TrialState.FAIL
        assert failed == [trial.number]  # recorded and retried there, once
        fail_stale_trials(seen, other)
        assert failed == [trial.number]
    finally:
        for s in (storage, other):
            s.backend.engine.dispose()
