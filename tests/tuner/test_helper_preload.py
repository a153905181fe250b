"""The tuner's rank server preloads what its process will fork
(training_harness.launch.rank_server):
the trials' imports where its trials' ranks are forked from it (the local launcher, one
node), the torch-side helper's alone where they run elsewhere (Slurm, several nodes, a
user's launcher). The choice is made before the helper starts it (training_harness.cli.tune)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.tuner.conftest import FAKE, ROOT, study_table, write_study
from training_harness.cli import tune as tune_cli
from training_harness.cli.main import build_parser
from training_harness.launch import rank_server
from training_harness.study.study_file import Study


class _Asked(Exception):
    pass


class _Probe:
    """The torch-side helper, as far as `check` goes before the study's facts."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def devices(self) -> dict[str, int]:
        self.events.append("devices")
        return {"cuda": 0}

    def study_facts(self, study) -> None:
        self.events.append("study_facts")
        raise _Asked


def _events_of_check(monkeypatch, argv: list[str]) -> list[str]:
    events: list[str] = []
    monkeypatch.setattr("training_harness.launch.torch_helper.shared", lambda: _Probe(events))
    monkeypatch.setattr(rank_server, "warm_up", lambda: events.append("warm_up"))
    args = build_parser().parse_args(["tune", *argv])
    with pytest.raises(_Asked):
        tune_cli.check(args, 0.0)
    return events


@pytest.mark.parametrize("flags, cluster, nnodes, forks", [
    ([], None, 1, True),
    (["--launcher", "local"], {"launcher": "slurm", "partition": "p"}, 1, True),
    (["--launcher", "training_harness.launch.local:launch"], None, 1, True),
    (["--launcher", "slurm"], None, 1, False),
    ([], {"launcher": "slurm", "partition": "p"}, 1, False),
    (["--launcher", FAKE], None, 1, False),
    ([], None, 2, False),
])
def test_the_trials_preload_is_chosen_before_the_helper_starts(monkeypatch, tmp_path, flags,
                                                               cluster, nnodes, forks):
    table = study_table(layout={"nnodes": nnodes, "world_sizes": [nnodes]})
    if cluster:
        table["cluster"] = cluster
    path = write_study(tmp_path, table)
    assert tune_cli._forks_trials(flags[1] if flags else None,
                                  Study.from_toml(path)) is forks
    events = _events_of_check(monkeypatch, [str(path), "--out", str(tmp_path / "run"), *flags])
    assert events == (["warm_up", "study_facts"] if forks else ["study_facts"])


def test_a_check_launches_nothing_so_warms_nothing(monkeypatch, tmp_path):
    path = write_study(tmp_path)
    events = _events_of_check(monkeypatch, [str(path), "--out", str(tmp_path / "run"),
                                            "--check"])
    assert events == ["study_facts"]


def test_the_default_study_warms_the_trials_server_before_asking_for_devices(monkeypatch,
                                                                            tmp_path):
    events = _events_of_check(monkeypatch, ["--out", str(tmp_path / "run")])
    assert events[:2] == ["warm_up", "devices"] and events[-1] == "study_facts"


def test_a_helper_alone_asks_for_the_helpers_preload(monkeypatch):
    asked = []

    def server(preload=rank_server.PRELOAD):
        asked.append(preload)
        raise _Asked

    monkeypatch.setattr(rank_server, "_server", server)
    with pytest.raises(_Asked):
        rank_server.serve({}, "/dev/null")
    assert asked == [rank_server.HELPER_PRELOAD]


# The product's value, before tests/conftest.py gives this process the trials' preload
HELPER_PRELOAD = ["training_harness.measure.helper_preload"]


@pytest.mark.timeout(120)
def test_the_helpers_preload_answers_without_dynamo_or_the_trial_loop():
    """What the light server imports is all a study's and a plan's questions need: were
    they to import torch._dynamo, the helper would pay it at its first question."""
    assert rank_server.PRELOAD != HELPER_PRELOAD  # see tests/conftest.py
    code = textwrap.dedent(f"""
        import sys, tomllib
        import {HELPER_PRELOAD[0]}
        from training_harness.measure import torch_helper_server as helper
        from tests.tiny import TINY_GPT

        study = tomllib.load(open("studies/quickstart.toml", "rb"))
        assert "ok" in helper.answer({{"op": "study", "study": study}})
        plan = {{"workload": "gpt", "workload_args": TINY_GPT, "device": "cpu",
                "micro_batch_size": 2, "global_batch_size": 8, "layout": {{"data": 2}},
                "strategies": {{"accumulation": {{}}, "amp": {{"dtype": "bf16"}},
                               "checkpoint": {{}}, "zero": {{"stage": 1}},
                               "fused": {{"attention": "sdpa", "optimizer": "fused"}}}}}}
        answer = helper.answer({{"op": "prepare", "plan": plan}})
        assert "ok" in answer, answer
        print(sorted(m for m in ("torch._dynamo", "training_harness.measure.trial_loop")
                     if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
