"""Neither the tuner (with its torch-side helper) nor `harness bench`'s own process runs
the peak calibration or a CUDA function: the calibration runs in a short-lived process
of its own (training_harness.measure.calibrate), and a trial's ranks are the only others that
may touch a device.

Every Python process these tests start loads a sitecustomize that replaces the
calibration's matmul and torch.cuda's entry points with functions that write a
line to a file and raise; the calibration process alone keeps the real ones. A study
and a bench, each with an empty peak cache (so a calibration must happen), then have
to pass, and the file must stay empty. The study is test_study_peaks.py's (its two
`harness tune` processes run under this guard); the bench is here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.tuner.conftest import ROOT

SITECUSTOMIZE = textwrap.dedent('''
    import importlib.abc, importlib.util, os, sys

    FORBIDDEN = {
        "training_harness.measure.calibrate": ("measure_peak", "_benchmark_matmul"),
        "torch.cuda": ("_lazy_init", "init", "synchronize", "set_device"),
    }

    def forbidden(module, name, original):
        def call(*args, **kwargs):
            with open(os.environ["FORBIDDEN_CALLS"], "a") as f:
                f.write(f"{module}.{name} in {sys.orig_argv}\\n")
            raise RuntimeError(f"{module}.{name} called outside the calibration process")
        return call

    class Patcher(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in FORBIDDEN:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                for name in FORBIDDEN[fullname]:
                    setattr(module, name, forbidden(fullname, name, getattr(module, name)))
            spec.loader.exec_module = exec_module
            return spec

    if "training_harness.measure.calibrate" not in sys.orig_argv:
        sys.meta_path.insert(0, Patcher())
''')

@pytest.fixture
def guarded(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    calls = tmp_path / "forbidden_calls.txt"
    calls.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "HARNESS_CACHE_DIR": str(tmp_path / "cache"), "FORBIDDEN_CALLS": str(calls)}
    return env, calls

def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training_harness", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)

@pytest.mark.slow
def test_a_bench_leaves_the_calibration_to_its_own_process(tmp_path, guarded):
    env, calls = guarded  # an empty cache: the bench must calibrate
    done = _run(["bench", "studies/plans/mlp.toml", "--device", "cpu", "--steps", "2",
                 "--warmup-steps", "1", "--out", str(tmp_path / "bench")], env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert calls.read_text() == ""
    assert (tmp_path / "cache" / "peaks.json").exists()

def test_the_guard_catches_a_calibration_in_the_wrong_process(guarded):
    """The check can fail: the matmul called here, outside the calibration process."""
    env, calls = guarded
    code = ("import torch\nfrom training_harness.measure.calibrate import measure_peak\n"
            "measure_peak(torch.device('cpu'), 'fp32')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "training_harness.measure.calibrate.measure_peak" in calls.read_text()
