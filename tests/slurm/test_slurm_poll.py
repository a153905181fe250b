"""How often the launcher asks Slurm for a job's state (training_harness.launch.slurm._wait): the
asks back off to POLL_S[1] apart, but once node 0 has written the trial's record the job
is ending, and the next ask comes at once. Slurm's squeue is a stand-in and the clock a
fake one, so this runs without a cluster and waits for nothing."""

from __future__ import annotations

from pathlib import Path

from tests.slurm.conftest import stand_in
from training_harness.launch import slurm
from training_harness.launch.slurm_record import Attempt


class FakeClock:
    """slurm's `time`: sleeping moves the clock on; node 0's record appears at `writes_at`."""

    def __init__(self, record: Path, writes_at: float):
        self.now, self.record, self.writes_at = 0.0, record, writes_at

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.now >= self.writes_at and not self.record.exists():
            self.record.write_text("{}\n")


def test_the_job_is_asked_for_as_soon_as_node_0s_record_appears(fake_bin, tmp_path,
                                                                 monkeypatch):
    record, asked = tmp_path / "result.json", tmp_path / "asked"
    # RUNNING until node 0's record is there, then gone from the queue (COMPLETED)
    stand_in(fake_bin, "squeue", f'echo ask >> {asked}; if [ -f {record} ]; then '
                                 'echo "COMPLETED|||||pair|"; else echo "RUNNING|||||pair|"; fi')
    clock = FakeClock(record, writes_at=1.0)
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "POLL_S", (30.0, 60.0))  # a wait that had backed off
    attempt = Attempt("7")
    slurm._wait(attempt, 600.0, None, None, record)
    assert attempt.info.state == "COMPLETED" and attempt.stopped is None
    assert asked.read_text().split() == ["ask", "ask"]
    # asked again within RECORD_CHECK_S of the record, not POLL_S[0] (30 s) after the first ask
    assert clock.now <= clock.writes_at + slurm.RECORD_CHECK_S


def test_without_a_record_the_asks_back_off(fake_bin, tmp_path, monkeypatch):
    record, asked = tmp_path / "result.json", tmp_path / "asked"
    # Three asks RUNNING, then ended without a record (a node that failed before writing)
    stand_in(fake_bin, "squeue", f'echo ask >> {asked}; if [ "$(wc -l < {asked})" -gt 3 ]; '
                                 'then echo "FAILED|||||pair|"; else echo "RUNNING|||||pair|"; fi')
    clock = FakeClock(record, writes_at=float("inf"))
    monkeypatch.setattr(slurm, "time", clock)
    monkeypatch.setattr(slurm, "POLL_S", (2.0, 3.0))
    attempt = Attempt("8")
    slurm._wait(attempt, 600.0, None, None, record)
    assert attempt.info.state == "FAILED" and len(asked.read_text().split()) == 4
    assert clock.now == 2.0 + 2.5 + 3.0  # 2 s, then 1.25 times longer, up to 3 s
