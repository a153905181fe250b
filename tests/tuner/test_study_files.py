"""Study files: the shipped ones load; a bad one is one line, exit 2, nothing run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tuner.conftest import FAKE, ROOT, study_table, tune, write_study
from training_harness.cli.main import main
from training_harness.core.errors import HarnessError
from training_harness.study.checks import check_study
from training_harness.study.defaults import default_study
from training_harness.study.study_file import Study

STUDIES = ROOT / "studies"


def test_quickstart_file_is_the_default_cpu_study():
    assert Study.from_toml(STUDIES / "quickstart.toml") == default_study("cpu")


@pytest.mark.parametrize("name", sorted(p.stem for p in STUDIES.glob("*.toml")))
def test_shipped_studies_are_valid(name):
    """Every study file shipped, checked for its own device (a CUDA study's checks run
    here without a GPU: its space, strategies and settings)."""
    study = Study.from_toml(STUDIES / f"{name}.toml")
    check_study(study, study.device if study.device != "auto" else "cpu")


BAD = {
    "unknown key": ({"budgett": {"time": "3m"}}, "unknown key 'budgett'"),
    "unknown key in a table": ({"budget": {"tme": "3m"}}, "budget: unknown key 'tme'"),
    "wrong type": ({"global_batch_size": "16"}, "global_batch_size: expected int"),
    "wrong type in a table": ({"budget": {"ablation_repeats": 1.5}},
                              "budget.ablation_repeats: expected int"),
    "impossible layout": ({"layout": {"world_sizes": [3], "tensor": [2]}}, "no layout fits"),
    "layout without its strategy": ({"layout": {"world_sizes": [2]}},
                                    "needs a data-parallel strategy"),
    "batch that does not divide": ({"global_batch_size": 6}, "no micro-batch"),
    "negative budget": ({"budget": {"time": "-5m"}}, "budget.time"),
    "zero trial timeout": ({"budget": {"trial_timeout": 0}}, "budget.trial_timeout"),
    "negative memory budget": ({"budget": {"memory": -1}}, "budget.memory"),
    "unknown strategy": ({"strategies": {"turbo": {}}}, "strategies.turbo: unknown strategy"),
    "unknown setting": ({"strategies": {"amp": {"search": ["speed"]}}},
                        "strategies.amp.search: 'speed'"),
    "bad setting value": ({"strategies": {"amp": {"values": {"dtype": ["fp8"]}}}},
                          "strategies.amp.values.dtype"),
    "fp16 asked for on a CPU": ({"strategies": {"amp": {"values": {"dtype": ["fp16"]}}}},
                                "cannot run here"),
    "accumulation listed": ({"strategies": {"accumulation": {}}}, "follows from the micro"),
    "unknown objective": ({"objective": "speed"}, "objective"),
    "known_good outside the space": ({"known_good": {"micro_batch_size": 5}},
                                     "known_good.micro_batch_size"),
    "unknown workload argument": ({"workload": {"name": "gpt", "depth": 3}}, "workload"),
    # found by tests/tuner/test_fuzz_studies.py, or on the way there
    "known_good.strategies not a table": ({"known_good": {"strategies": 0}},
                                          "known_good.strategies: expected a table"),
    "known_good setting unknown": ({"known_good": {"strategies": {"amp": {"dtyp": "bf16"}}}},
                                   "known_good.strategies.amp: unknown key 'dtyp'"),
    "known_good of an unknown strategy": ({"strategies": {"turbo": {}},
                                           "known_good": {"strategies": {"turbo": {}}}},
                                          "known_good.strategies.turbo: unknown strategy"),
    "known_good micro-batch a bool": ({"known_good": {"micro_batch_size": True}},
                                      "known_good.micro_batch_size"),
    "seed numpy cannot take": ({"seed": 2**32}, "seed: must be between 0 and 4294967295"),
    "infinite memory budget": ({"budget": {"memory": float("inf")}}, "budget.memory inf"),
    "nan memory budget": ({"budget": {"memory": float("nan")}}, "budget.memory: nan"),
    "memory budget of no bytes": ({"budget": {"memory": 1e-300}}, "budget.memory 1e-300"),
    "infinite study time": ({"budget": {"time": float("inf")}}, "budget.time inf: must be at"),
    "a size too large": ({"budget": {"memory": "9" * 400 + "GiB"}}, "budget.memory '999"),
    "a duration too long": ({"budget": {"trial_timeout": "4000d"}}, "budget.trial_timeout"),
    "a doubled key in a narrowed value": (
        {"strategies": {"amp": {"values": {"dtype": ["fp8"]}}}},
        "strategies.amp.values.dtype: 'fp8' is not one of"),
    "a range of words": ({"strategies": {"amp": {"values": {"dtype": {"low": "bf16",
                                                                      "high": "fp16"}}}}},
                         "strategies.amp.values.dtype: a range needs finite numbers"),
    "a log range from 0": ({"strategies": {"lamb": {"values": {"max_grad_norm": {
        "low": 0.0, "high": 1.0, "log": True}}}}}, "needs low above 0"),
    "a range with an unknown key": ({"strategies": {"lamb": {"values": {"max_grad_norm": {
        "low": 0.0, "high": 1.0, "step": 0.5}}}}}, "unknown key 'step' in a range"),
    "a strategy that is false": ({"strategies": {"amp": False}},
                                 "strategies.amp: expected a table, got bool"),
    "micro range without max": ({"micro_batch_sizes": {"min": 2}},
                                "micro_batch_sizes: missing key 'max'"),
    "micro list of words": ({"micro_batch_sizes": [4, "8"]}, "micro_batch_sizes[1]: expected"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_study_is_one_line_exit_2_and_nothing_runs(case, tmp_path, capsys, launched):
    changes, words = BAD[case]
    table = study_table()
    for key, value in changes.items():  # replace (not merge) the strategies table
        if key == "strategies":
            table["strategies"] = value
        elif isinstance(value, dict) and isinstance(table.get(key), dict):
            table[key] = {**table[key], **value}
        else:
            table[key] = value
    path = write_study(tmp_path, table)
    out = tmp_path / "run"
    code = tune(str(path), "--out", str(out))
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert words in err, err
    assert not out.exists() and launched == []


@pytest.mark.parametrize("flags, words", [
    (["--budget=-5m"], "--budget"),
    (["--budget", "soon"], "--budget"),
    (["--memory-budget", "lots"], "--memory-budget"),
    (["--workers", "0"], "--workers"),
    (["--n-trials", "0"], "--n-trials"),
    (["--resume"], "holds no study"),
    (["--launcher", "nowhere.mod:fn"], "--launcher"),
])
def test_bad_flags_are_one_line_exit_2(flags, words, tmp_path, capsys, launched):
    out = tmp_path / "run"
    args = ["tune", str(write_study(tmp_path)), "--out", str(out), *flags]
    code = main(args if "--launcher" in flags else args + ["--launcher", FAKE])
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and launched == []


def test_an_existing_run_folder_needs_resume(tmp_path, capsys):
    out = tmp_path / "run"
    path = write_study(tmp_path, budget={"ablation_repeats": 0})
    assert tune(str(path), "--out", str(out), "--n-trials", "2") == 0
    capsys.readouterr()
    assert tune(str(path), "--out", str(out)) == 2
    assert "--resume" in capsys.readouterr().err
    # --check changes nothing, so it does not refuse: it says what a run would need
    before = sorted(out.rglob("*"))
    assert tune(str(path), "--out", str(out), "--check") == 0
    printed = capsys.readouterr().out
    assert f"{out} (already holds study 'quickstart'; a run would need --resume" in printed
    assert sorted(out.rglob("*")) == before


def test_durations_and_sizes():
    from training_harness.core.units import parse_duration

    assert parse_duration("90s") == 90 and parse_duration("30m") == 1800
    assert parse_duration("6h") == 6 * 3600 and parse_duration("1d") == 86400
    assert parse_duration("1h30m") == 5400 and parse_duration(45) == 45
    for bad in ("-5m", "0s", "5 minutes", "", "m"):
        with pytest.raises(HarnessError):
            parse_duration(bad)


def test_study_as_run_round_trips(tmp_path: Path):
    study = Study.from_toml(STUDIES / "quickstart.toml")
    again = Study.from_dict(__import__("tomllib").loads(study.to_toml()))
    assert again == study


def test_check_prints_what_would_run_and_creates_nothing(tmp_path, capsys, launched):
    out = tmp_path / "run"
    assert tune(str(write_study(tmp_path)), "--out", str(out), "--check") == 0
    printed = capsys.readouterr().out
    for words in ("study         quickstart", "throughput (maximize)", "device        cpu",
                  "60 configurations", "3m wall clock", f"{out} (new; not created yet)",
                  "first trials  baseline, known-good", "estimator     ", FAKE):
        assert words in printed, printed
    assert not out.exists() and launched == []


def test_check_says_whether_the_estimator_has_this_devices_profile():
    """Without a profile the first guesses cannot rank micro-batches (the step is the
    datasheet's at an assumed MFU): the check says so and how to measure one."""
    from training_harness.cli.tune_check import _estimator
    from training_harness.study.machine_facts import MachineFacts

    gpu = MachineFacts("cuda", "NVIDIA H100 80GB HBM3", 1, 80 * 2**30)
    assert "no profile" in _estimator(gpu) and "harness calibrate --device cuda" in _estimator(gpu)
    gpu.profile_measured = "2026-12-06T13:45:14+0000"
    assert _estimator(gpu) == ("this device's profile (harness calibrate, "
                               "2026-12-06T13:45:14+0000)")
    again = MachineFacts.from_json(gpu.to_json())
    assert again.profile_measured == gpu.profile_measured
    old = gpu.to_json()
    del old["profile_measured"]  # a study.json written before the field: no profile known
    assert MachineFacts.from_json(old).profile_measured == ""


def test_check_of_a_space_with_ranges_says_unbounded(tmp_path, capsys):
    path = write_study(tmp_path, strategies={"lamb": {"values": {"max_grad_norm": {
        "low": 0.5, "high": 2.0}}}})
    assert tune(str(path), "--out", str(tmp_path / "run"), "--check") == 0
    assert "unbounded" in capsys.readouterr().out


def test_check_refuses_a_bad_study_like_a_run(tmp_path, capsys):
    path = write_study(tmp_path, global_batch_size=6)
    assert tune(str(path), "--out", str(tmp_path / "run"), "--check") == 2
    err = capsys.readouterr().err
    assert "no micro-batch" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("out", ["file/sub", "file", "file/a/b/c", "link/sub"])
def test_an_unwritable_run_folder_is_refused_up_front(out, tmp_path, capsys, launched):
    (tmp_path / "file").write_text("a regular file, not a folder")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    study = write_study(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    for extra in ([], ["--check"]):
        code = tune(str(study), "--out", str(tmp_path / out), *extra)
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"--out {tmp_path / out}" in err and "give --out a folder" in err, err
    assert sorted(tmp_path.rglob("*")) == before and launched == []


def test_an_unwritable_default_run_folder_is_refused(tmp_path, capsys, monkeypatch):
    path = write_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    assert tune(str(path), "--check") == 2
    err = capsys.readouterr().err
    assert "run folder runs/quickstart" in err and "--out DIR" in err, err


def test_a_read_only_place_for_the_run_folder_is_refused(tmp_path, capsys, monkeypatch):
    """What os.access says of a read-only file system or folder (root writes anyway,
    so the answer is faked)."""
    import training_harness.cli.tune_check

    path = write_study(tmp_path)
    monkeypatch.setattr(training_harness.cli.tune_check.os, "access", lambda *a, **k: False)
    assert tune(str(path), "--out", str(tmp_path / "new" / "run"), "--check") == 2
    err = capsys.readouterr().err
    assert f"cannot make the run folder in {tmp_path} (not writable)" in err, err
    assert not (tmp_path / "new").exists()
