"""On a GPU: no process but a trial's ranks and the short-lived calibration touches CUDA.

A fresh process does what the tuner's helper and `harness bench` do before a trial
starts (device facts, the study's checks and fixed peaks, preparing a CUDA plan)
with an empty peak cache, so the calibration matmul has to run. Afterwards that
process must hold no CUDA context (torch's own check, and NVML's list of the
device's compute processes), while the peak cache holds the calibrated figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from training_harness.core.plan import Plan
    from training_harness.measure import probe_server
    from training_harness.measure.prepare import prepare
    from training_harness.study.study_file import Study
    import tomllib

    study = tomllib.loads(open("studies/gpt2-small-1gpu.toml").read())
    facts = probe_server.study_facts(Study.from_dict(study).to_dict())
    plan = Plan.from_dict({"name": "iso", "device": "cuda", "workload": {"name": "gpt",
                           "layers": 2, "hidden": 128, "heads": 2, "seq_len": 64,
                           "vocab": 512}, "strategies": {"amp": {"dtype": "bf16"}}},
                          where="plan")
    served = probe_server.prepare(plan.to_dict(), facts["peaks"])
    checked = prepare(plan).checked()  # what harness bench does in its own process
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    print(json.dumps({"context": bool(torch._C._cuda_hasPrimaryContext(0)),
                      "pid": os.getpid(), "nvml_pids": pids,
                      "peaks": sorted(facts["peaks"]), "served": served["peak"],
                      "bench": checked.peak}))
""")


@pytest.mark.gpu
@pytest.mark.slow
def test_tuner_helper_and_bench_leave_the_gpu_to_the_trials(tmp_path):
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert not seen["context"], "the preparing process made a CUDA context"
    assert seen["pid"] not in seen["nvml_pids"], seen
    assert {"fp32", "bf16", "fp16"} <= set(seen["peaks"])
    # the fixed peak was used as given; the bench's own lookup hit the cache it filled
    assert seen["served"]["measured"] == seen["bench"]["measured"]
    cached = json.loads((tmp_path / "cache" / "peaks.json").read_text())["entries"]
    assert any("bf16" in key for key in cached), cached
