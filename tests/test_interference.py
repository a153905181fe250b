"""Interference: a trial measured beside other work says so (metrics.interference).

The real-trial tests run a short trial in this process, once with CPU-bound
processes beside it (one per CPU this process may use, each in its own session, so
they are not the trial's) and once without. Nothing asserts how fast anything ran:
only what share of the CPUs the others took, and the flag it sets.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from training_harness.core.interference import (
    QUIET_CPU_SHARE,
    InterferenceMeter,
    _others_on_gpu,
    combine_ranks,
    cpus,
    interference,
    machine_share_of_others,
    ours,
)
from training_harness.core.plan import Plan
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.records.predicates import busy_note

PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}


def prepared_trial(warmup_steps: int = 2, steps: int = 12):
    plan = Plan(name="interference", workload="gpt",
                workload_args=dict(layers=2, heads=4, hidden=128, seq_len=128, vocab=512),
                device="cpu", micro_batch_size=8, warmup_steps=warmup_steps, steps=steps)
    return prepare(plan, peaks={"fp32": PEAK})


def short_trial():
    return run_trial(prepared_trial(), "test")


@pytest.mark.slow  # a trial beside one spinning process per CPU: slows everything else
@pytest.mark.alone  # ... so the other worker's tests wait
def test_a_trial_beside_cpu_bound_processes_is_flagged():
    # Four steps, prepared before the hogs start: they spin the whole window, so its
    # share is as plain in a window of a second as in one of ten (read in /proc/stat's
    # 10 ms ticks), and each second they spin costs a CPU-second per hog.
    prepared = prepared_trial(warmup_steps=1, steps=4)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in cpus()]
    try:
        time.sleep(0.5)  # running before the window opens
        result = run_trial(prepared, "test")
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    seen = result.metrics["interference"]
    assert result.status == "ok"
    # One spinning process per CPU competes with the trial's threads for every core:
    # the scheduler gives them a large share (about half on a machine with two).
    assert seen["other_cpu_share"] >= 0.25, seen
    assert seen["flagged"] is True
    assert busy_note(result.to_dict()).startswith("others used")


@pytest.mark.alone  # the other worker's test would make the machine busy
def test_a_quiet_trial_is_not_flagged():
    # The premise: nothing else runs here now (this process and its children aside).
    busy = machine_share_of_others(1.0, ours)
    if busy >= QUIET_CPU_SHARE / 2:
        pytest.skip(f"this machine is not quiet: others use {busy:.0%} of its CPUs")
    result = short_trial()
    seen = result.metrics["interference"]
    assert result.status == "ok"
    assert seen["other_cpu_share"] < QUIET_CPU_SHARE, seen
    assert seen["flagged"] is False and busy_note(result.to_dict()) is None
    assert seen["trial_cpu_share"] > 0  # the trial's own threads were counted as its own
    assert seen["other_gpu_processes"] is None  # a CPU: nothing to ask NVML


def test_flag_rules():
    # others busy while the CPUs were full: flagged
    assert interference(0.3, 0.7, 2, None)["flagged"] is True
    # others busy, but the CPUs had room (a GPU trial's one core beside helper workers)
    assert interference(0.2, 0.06, 16, None)["flagged"] is False
    # a little background work beside a CPU trial: not flagged
    assert interference(0.03, 0.95, 2, None)["flagged"] is False
    # another process computing on the trial's GPU: flagged whatever the CPUs did
    assert interference(0.0, 0.05, 16, [{"pid": 7, "used_memory_bytes": 1}])["flagged"]


def test_other_gpu_processes_are_those_not_in_the_trial():
    ours = {10, 11}
    seen = [[{"pid": 10, "used_memory_bytes": 5}], [{"pid": 10, "used_memory_bytes": 5},
                                                     {"pid": 99, "used_memory_bytes": 7}]]
    assert _others_on_gpu(seen, ours) == [{"pid": 99, "used_memory_bytes": 7}]
    # NVML's PIDs name none of ours (another PID namespace): it cannot say
    assert _others_on_gpu([[{"pid": 99, "used_memory_bytes": 7}]], ours) is None
    assert _others_on_gpu([None, []], ours) is None


def test_ranks_combine_to_the_busiest_and_any_flag():
    a = interference(0.02, 0.9, 2, [])
    b = interference(0.4, 0.6, 2, [{"pid": 3, "used_memory_bytes": None}])
    job = combine_ranks([a, b])
    assert job["other_cpu_share"] == 0.4 and job["flagged"] is True
    assert job["other_gpu_processes"] == [{"pid": 3, "used_memory_bytes": None}]
    assert combine_ranks([None, None]) is None


def test_a_meter_never_stopped_reads_nothing():
    meter = InterferenceMeter()
    meter.start()
    assert meter.reading() is None


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_busy_note_says_how_busy(share):
    record = {"metrics": {"interference": interference(share, 0.5, 2, None)}}
    note = busy_note(record)
    assert (note is None) if share == 0.0 else note == "others used 50% of the CPUs"
