"""The device's own terms (CUDA context, workspaces, NCCL buffers) in a CUDA estimate.

The raw estimate predicts what the device holds for a trial, as NVML reports it, so
it counts what the process holds beyond its tensors (measured once per GPU by
training_harness.measure.device_overhead); the tuner's correction fits its ratio on the
tensors alone and stands for these terms with what trials measured.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.estimator.models import CPU, CUDA, TinyGPTWorkload, gpt_plan
from training_harness.cli.bench_table import estimate_table
from training_harness.core.overhead import DeviceOverhead
from training_harness.core.plan import Layout
from training_harness.estimator import estimate
from training_harness.tune.model.correction import Correction

MIB = 1024**2
H100ISH = DeviceOverhead(context_bytes=500 * MIB, workspace_bytes=40 * MIB,
                         nccl_bytes_per_communicator=100 * MIB, source="measured (test)")


def test_cuda_estimate_counts_context_and_workspaces():
    w = TinyGPTWorkload(layers=2)
    plain = estimate(gpt_plan(), w, CUDA)
    counted = estimate(gpt_plan(), w, CUDA, overhead=H100ISH)
    assert counted.peak_memory_bytes == plain.peak_memory_bytes + 540 * MIB
    assert counted.memory["device_context"] == 540 * MIB
    assert counted.memory["nccl_buffers"] == 0  # one device: no communicator
    assert counted.device_overhead_bytes == 540 * MIB
    assert counted.upper_bound_bytes == plain.upper_bound_bytes + 540 * MIB


def test_nccl_buffers_per_parallel_axis():
    w = TinyGPTWorkload(layers=2)
    plan = gpt_plan()
    plan.layout = Layout(data=2, tensor=2)
    plan.strategies = {"zero": {"stage": 2}, "tensor": {}}
    e = estimate(plan, w, CUDA, overhead=H100ISH)
    assert e.memory["nccl_buffers"] == 2 * 100 * MIB
    assert "NCCL" in " ".join(e.assumptions)


def test_cpu_estimate_has_no_device_terms():
    w = TinyGPTWorkload(layers=2)
    e = estimate(gpt_plan(), w, CPU, overhead=H100ISH)
    assert e.memory["device_context"] == e.memory["nccl_buffers"] == 0
    assert e.peak_memory_bytes == estimate(gpt_plan(), w, CPU).peak_memory_bytes


def test_harness_estimate_names_the_context_and_workspace_term():
    record = estimate(gpt_plan(), TinyGPTWorkload(layers=2), CUDA, overhead=H100ISH).to_record()
    table = estimate_table(record)
    assert "memory: device_context" in table
    assert "CUDA context 500.00 MiB + cuBLAS/attention workspaces 40.00 MiB" in table


def test_correction_fits_tensors_and_starts_from_the_measured_overhead():
    predicted = {"peak_memory_bytes": 1540 * MIB, "device_overhead_bytes": 540 * MIB}
    assert Correction().peak_memory(predicted) == 1540 * MIB  # before any trial
    trial = {"status": "ok", "plan": {}, "predicted": predicted,
             "metrics": {"peak_memory_bytes": 2600 * MIB,
                         "memory": {"allocated": 1, "device_base": 600 * MIB}}}
    fitted = Correction.from_records([trial], "cuda")
    assert fitted.runtime_bytes == 600 * MIB
    assert fitted.memory_ratio == 2.0  # (2600 - 600) / 1000 MiB of tensors


def test_overhead_record_round_trips_and_refuses_bad_figures():
    assert DeviceOverhead.from_record({"context_bytes": 1, "workspace_bytes": 2,
                                       "nccl_bytes_per_communicator": 3, "source": "x"}) \
        == DeviceOverhead(1, 2, 3, "x")
    assert DeviceOverhead.from_record({"context_bytes": -1, "workspace_bytes": 2,
                                       "nccl_bytes_per_communicator": 3, "source": "x"}) is None
    assert DeviceOverhead.from_record({"context_bytes": 1}) is None


def test_calibration_process_answers_the_overhead_question():
    out = subprocess.run([sys.executable, "-m", "training_harness.measure.calibrate", "--overhead",
                          "cpu"],
                         capture_output=True, text=True, timeout=120, check=True)
    found = DeviceOverhead.from_record(json.loads(out.stdout.strip().splitlines()[-1]))
    assert found == DeviceOverhead.none("cpu")
