"""A study fixes its MFU denominators at its start, in study.json, and every trial, a
resumed study's too, divides by those: a cached peak dropped and measured again in
the meantime (training_harness.measure.peaks.forget_measured_peak) changes nothing. Both
`harness tune` processes run under test_no_calibration_here.py's guard: the study's
calibration runs in a process of its own, never in the tuner or its helper."""

from __future__ import annotations

import json

import pytest

from tests.tuner.conftest import SEARCH_ONLY, records, study_table, tune_process, write_study
from tests.tuner.test_no_calibration_here import guarded  # noqa: F401  (the fixture)


def _tune(tmp_path, guard, *args: str) -> None:
    env, calls = guard  # its HARNESS_CACHE_DIR: tmp_path / "cache", empty at first
    study = write_study(tmp_path, study_table(budget=SEARCH_ONLY))  # the peaks: no final phases
    proc = tune_process(str(study), "--out", str(tmp_path / "run"), "--quiet", *args,
                        env=env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert calls.read_text() == ""  # no calibration nor CUDA call in the tuner's processes


@pytest.mark.slow  # two `harness tune` processes, the first calibrating: ~20 s quiet
def test_a_resumed_study_keeps_the_peaks_it_started_with(tmp_path, guarded):  # noqa: F811
    # a budget far above what 2 trials need: on a loaded machine the measured peak is low
    # and the predicted trial time long; n_trials ends the search, not the budget
    _tune(tmp_path, guarded, "--budget", "10m", "--n-trials", "2")
    assert (tmp_path / "cache" / "peaks.json").exists()  # calibrated, elsewhere
    info = json.loads((tmp_path / "run" / "study.json").read_text())
    fixed = info["peaks"]
    assert fixed["fp32"]["measured"]["source"].startswith("measured: ")

    def divides_by_the_fixed_peak(r):  # on a CPU the dtype run is the compute dtype
        peak = r["metrics"]["peak_flops"]
        return peak["measured"] == fixed[peak["dtype"]]["measured"]

    first = records(tmp_path / "run")
    assert first and all(divides_by_the_fixed_peak(r) for r in first if r["status"] == "ok")

    # The cache now holds another figure, as after a dropped and re-measured peak.
    cache = tmp_path / "cache" / "peaks.json"
    data = json.loads(cache.read_text())
    for entry in data["entries"].values():
        entry.update(flops=entry["flops"] * 3, source="measured: again, later")
    cache.write_text(json.dumps(data))
    _tune(tmp_path, guarded, "--resume", "--budget", "10m", "--n-trials", "4")
    info = json.loads((tmp_path / "run" / "study.json").read_text())
    assert info["peaks"] == fixed
    later = records(tmp_path / "run")[len(first):]
    assert any(r["status"] == "ok" for r in later), "the resumed study measured more trials"
    assert all(divides_by_the_fixed_peak(r) for r in later if r["status"] == "ok")
