"""The launcher seam (training_harness.launch.launcher) without starting anything: the defaults,
the adapter of a user's --launcher function, the local and Slurm launchers' answers."""

from __future__ import annotations

import pytest

from training_harness.cli.tune import _launcher
from training_harness.core.cluster import ClusterSpec
from training_harness.core.errors import HarnessError
from training_harness.launch import local
from training_harness.launch.launcher import FunctionLauncher, Launcher, as_launcher
from training_harness.launch.local import LocalLauncher
from training_harness.launch.slurm import SlurmLauncher


def plain(prepared, out_dir, command, **kwargs):
    return ("launched", out_dir, command, kwargs)


def with_attributes(prepared, out_dir, command, **kwargs):
    return "launched"


with_attributes.max_jobs = 3  # type: ignore[attr-defined]
with_attributes.has_job = lambda folder: str(folder).endswith("job")  # type: ignore[attr-defined]
with_attributes.rejoin = (  # type: ignore[attr-defined]
    lambda folder, *, deadline=None, should_stop=None: ("rejoined", folder, deadline))


class Mine(Launcher):
    def launch(self, prepared, out_dir, command, **kwargs):
        return "mine"


INSTANCE = Mine()


def test_a_plain_function_gets_the_defaults_of_a_launcher_whose_trials_run_here():
    launcher = as_launcher(plain)
    assert isinstance(launcher, FunctionLauncher)
    assert launcher.launch("p", "out", "cmd", trial_id=1) == ("launched", "out", "cmd",
                                                             {"trial_id": 1})
    assert launcher.max_jobs == 1 and not launcher.may_leave_jobs
    assert launcher.has_job("x") is False and launcher.rejoin("x", deadline=1.0) is None
    assert launcher.check_shared("runs/x") is None
    assert launcher.name == f"{__name__}:plain"


def test_a_functions_attributes_are_read_once_when_it_is_wrapped():
    launcher = FunctionLauncher(with_attributes)
    assert launcher.max_jobs == 3 and launcher.may_leave_jobs
    assert launcher.has_job("a/job") and not launcher.has_job("a/none")
    assert launcher.rejoin("f", deadline=5.0) == ("rejoined", "f", 5.0)
    with_attributes.max_jobs = 7  # type: ignore[attr-defined]
    try:
        assert launcher.max_jobs == 3
    finally:
        with_attributes.max_jobs = 3  # type: ignore[attr-defined]


def test_the_launcher_flag_gives_a_launcher():
    assert isinstance(_launcher(None, type("S", (), {"cluster": None})(), "cpu"), LocalLauncher)
    assert isinstance(_launcher("training_harness.launch.local:launch", None, "cpu"), LocalLauncher)
    assert _launcher(f"{__name__}:INSTANCE", None, "cpu") is INSTANCE  # taken as it is
    wrapped = _launcher(f"{__name__}:with_attributes", None, "cpu")
    assert isinstance(wrapped, FunctionLauncher) and wrapped.max_jobs == 3
    with pytest.raises(HarnessError, match="has no function"):
        _launcher(f"{__name__}:nothing_here", None, "cpu")


def test_the_local_launcher_is_local_launch_with_the_defaults(monkeypatch):
    monkeypatch.setattr(local, "launch", plain)
    launcher = LocalLauncher()
    assert launcher.launch("p", "out", "cmd", timeout_s=3) == ("launched", "out", "cmd",
                                                              {"timeout_s": 3})
    assert launcher.max_jobs == 1 and not launcher.may_leave_jobs
    assert launcher.has_job("x") is False and launcher.rejoin("x") is None
    assert launcher.check_shared("runs/x") is None
    assert launcher.name == "training_harness.launch.local:launch"


def test_the_slurm_launcher_answers_from_its_cluster_and_the_trials_folder(tmp_path):
    launcher = SlurmLauncher(ClusterSpec(launcher="slurm", max_jobs=4))
    assert launcher.max_jobs == 4 and launcher.may_leave_jobs
    assert launcher.name == "training_harness.launch.slurm:launch"
    assert not launcher.has_job(tmp_path) and launcher.rejoin(tmp_path, deadline=1.0) is None
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "job.json").write_text("{}")
    assert launcher.has_job(tmp_path)
    assert launcher.rejoin(tmp_path) is None  # written down, but unreadable: nothing to wait for
