"""The progress file (issue 23): rank 0's steps.log lines are buffered inside the measured
window and written by a thread of their own (the tuner's slow-trial pruning still reads
them while the trial runs) and after the window; the steps' thread writes no file
between the window's ends."""

from __future__ import annotations

import threading
import time

from tests.test_measurement_window import prepared
from training_harness.measure import timing
from training_harness.measure.trial_loop import measure
from training_harness.records import step_log
from training_harness.records.step_log import STEP_LOG_ENV, StepWriter, read_steps


def test_a_step_is_only_buffered_and_the_thread_writes_it(tmp_path, monkeypatch):
    writes: list[str] = []
    real = step_log._append
    monkeypatch.setattr(step_log, "_append", lambda path, text: (
        writes.append(threading.current_thread().name), real(path, text)))
    path = tmp_path / "steps.log"
    writer = StepWriter(str(path), interval_s=0.05)
    for i in range(5):
        writer(i, 0.1 * (i + 1))
    assert writes == [] or writes == ["step-log"]  # the caller wrote nothing itself
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:  # the pruner's view, meanwhile
        time.sleep(0.01)
    assert read_steps(path) == [0.1, 0.2, 0.30000000000000004, 0.4, 0.5]
    writer(5, 0.6)
    writer.close()
    assert read_steps(path)[-1] == 0.6 and not writer._thread.is_alive()
    assert set(writes) <= {"step-log", threading.current_thread().name}


def test_the_trial_loop_writes_no_line_inside_the_window(tmp_path, monkeypatch):
    log: list[tuple[str, str]] = []
    real_sync, real_append = timing.synchronize, step_log._append

    def sync(device):
        log.append(("sync", threading.current_thread().name))
        real_sync(device)

    def append(path, text):
        log.append(("write", threading.current_thread().name))
        real_append(path, text)

    monkeypatch.setattr(timing, "synchronize", sync)
    monkeypatch.setattr(step_log, "_append", append)
    progress = tmp_path / "steps.log"
    monkeypatch.setenv(STEP_LOG_ENV, str(progress))
    metrics, status, _ = measure(prepared(warmup=1, steps=6))
    assert status == "ok"
    main = threading.current_thread().name
    syncs = [i for i, (what, _) in enumerate(log) if what == "sync"]
    start, end = syncs[0], syncs[-1]  # the window's two synchronisations
    inside = log[start + 1:end]
    assert ("write", main) not in inside  # the steps' thread wrote nothing in the window
    assert ("write", main) in log[end:] or ("write", "step-log") in log
    assert read_steps(progress) == metrics["step_times_s"]  # every line, in order
    lines = progress.read_text().splitlines()
    assert [int(line.split()[0]) for line in lines] == [1, 2, 3, 4, 5, 6]
