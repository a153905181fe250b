"""kill -9 of the tuner at random moments of a study, then --resume: every trial it
started ends with exactly one readable record (issue 26; docs/reliability.md).

The tuner is a fork of this process, killed (SIGKILL) at a moment a seed picks among
its writes (a record, a trial's files, study.json, Optuna's tell, a launch); half
the seeds tear the record being written first, as a power loss would."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.tuner import fake_launch
from tests.tuner.conftest import tune, write_study
from tests.tuner.test_torn_records import one_readable_record_per_trial
from training_harness.launch import torch_helper
from training_harness.records import run_store
from training_harness.records.result import TrialResult
from training_harness.records.run_store import RunStore
from training_harness.tune.recorder import Recorder

# The tuner's writes a kill may land before or after (Optuna's own are inside its
# tell; a kill between ask() and the worker tag is not tried: docs/reliability.md).
MOMENTS = [(RunStore, "append"), (run_store, "write_atomic"), (TrialResult, "write"),
           (Recorder, "tell"), (fake_launch, "launch")]


def at_each_moment(monkeypatch: pytest.MonkeyPatch, tick) -> None:
    """`tick(name, args)` before and after each of MOMENTS."""
    for owner, name in MOMENTS:
        real = getattr(owner, name)

        def wrapped(*args, _real=real, _name=name, **kw):
            tick(f"before {_name}", args)
            value = _real(*args, **kw)
            tick(f"after {_name}", args)
            return value

        monkeypatch.setattr(owner, name, wrapped)


def kill_study(path: Path, out: Path, moment: int, tear: float | None) -> int:
    """Run the study in a fork of this process, killed (SIGKILL) at its `moment`-th
    tick; a record about to be appended then is torn first at fraction `tear` of its
    line. Returns how the fork ended (the signal, or 0: the study ended first)."""
    pid = os.fork()
    if pid == 0:  # the tuner
        try:
            # It asks this process's torch-side helper (started by `moments`), which it
            # cannot wait for (not its child: Popen.poll would call it ended), and which
            # no kill interrupts mid-question (kills land at the ticks only).
            helper = torch_helper.shared()
            if helper._proc is not None:
                helper._proc.poll = lambda: None
            ticks = [0]

            def tick(name, args):
                ticks[0] += 1
                if ticks[0] != moment:
                    return
                if name == "before append" and tear is not None:  # power lost mid-line
                    store, record = args[0], args[1]
                    line = (json.dumps(record.to_dict() if isinstance(record, TrialResult)
                                       else record) + "\n").encode()
                    with open(store.trials_jsonl, "ab") as f:
                        f.write(line[:max(int(len(line) * tear), 1)])
                os.kill(os.getpid(), signal.SIGKILL)

            with pytest.MonkeyPatch.context() as patched:
                at_each_moment(patched, tick)
                tune(str(path), "--out", str(out), "--budget", "10m")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


@pytest.fixture
def moments(tmp_path_factory, monkeypatch) -> tuple[Path, list[str]]:
    """The study the kill tests run, and its ticks, in order, run whole (in this
    process: it also starts the torch-side helper the forks share)."""
    root = tmp_path_factory.mktemp("whole")
    path = write_study(root, budget={"ablation_repeats": 1, "confirm_repeats": 0,
                                     "n_trials": 4}, sampler="random")
    ticks: list[str] = []
    with monkeypatch.context() as patched:
        at_each_moment(patched, lambda name, args: ticks.append(name))
        assert tune(str(path), "--out", str(root / "run"), "--budget", "10m") == 0
    return path, ticks


def test_chaos_kill_9_at_random_moments_then_resume(moments, tmp_path, capsys):
    path, ticks = moments
    appends = [i + 1 for i, name in enumerate(ticks) if name == "before append"]
    for seed in range(4):
        rng = random.Random(seed)
        out = tmp_path / f"run-{seed}"
        if seed % 2:  # power lost while a record was written: torn at a random byte
            moment, tear = rng.choice(appends), rng.uniform(0.01, 0.99)
        else:
            moment, tear = rng.randint(1, len(ticks)), None
        ended = kill_study(path, out, moment, tear)
        # (0: this run ticked fewer times than the one counted, and ended first)
        assert ended in (signal.SIGKILL, 0), (seed, moment, len(ticks))
        if not (out / "study.toml").exists():
            continue  # killed before the run folder was made: nothing to resume
        assert tune("--resume", "--out", str(out), "--budget", "10m") == 0, (seed, moment)
        records = one_readable_record_per_trial(out)
        err = capsys.readouterr().err
        torn = sorted(out.glob("trials.jsonl.torn-*"))
        assert bool(torn) == (tear is not None and ended != 0), (seed, torn)
        assert all(c.name in err for c in torn), (seed, err)
        assert any(r["tags"]["phase"] == "ablation" for r in records), seed


def test_chaos_killed_between_ask_and_tag_then_resume(moments, tmp_path, monkeypatch):
    """A tuner killed in the milliseconds between Optuna's ask() and its worker tag left
    an untagged RUNNING trial: --resume waits out the grace in which another worker's
    fresh trial would have been tagged (shortened here), then settles it."""
    import optuna

    from training_harness.tune.recovery import resume

    path, _ = moments
    out = tmp_path / "run"
    assert tune(str(path), "--out", str(out), "--budget", "10m") == 0
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal")))
    study = optuna.load_study(study_name=json.loads((out / "study.json").read_text())["name"],
                              storage=storage)
    asked = study.ask()  # the kill: no tag, no record
    monkeypatch.setattr(resume, "UNTAGGED_GRACE_S", 1.0)
    assert tune("--resume", "--out", str(out), "--budget", "10m") == 0
    records = one_readable_record_per_trial(out)
    assert asked.number in {r["tags"].get("optuna_number") for r in records}
