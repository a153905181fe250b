"""Job states where Slurm keeps no accounting (no sacct, as on the local clusters here),
and where its controller stops answering: no trial waits for ever. Slurm's commands are
stand-ins on PATH, so these run without a cluster."""

from __future__ import annotations

from tests.slurm.conftest import stand_in
from training_harness.launch import slurm
from training_harness.launch import slurm_queue as queue
from training_harness.launch.slurm_record import Attempt, reason_for


def test_a_job_slurm_has_forgotten_without_accounting_ends_the_wait(fake_bin):
    # Past MinJobAge squeue no longer knows the job, and there is no accounting to ask.
    stand_in(fake_bin, "squeue", 'echo "slurm_load_jobs error: Invalid job id specified" >&2'
                                 "; exit 1")
    stand_in(fake_bin, "sacct", 'echo "sacct: error: Slurm accounting storage is disabled" >&2'
                                "; exit 1")
    assert queue.job_info("123").over
    attempt = Attempt("123")
    slurm._wait(attempt, 60.0, None, None)
    assert attempt.info.state == "UNKNOWN" and attempt.stopped is None
    status, reason = reason_for(attempt, 60.0, 60.0, None)
    assert status == "failed" and reason.startswith("job 123 ended UNKNOWN (neither squeue nor "
                                                    "sacct knows the job any more)")


def test_a_controller_that_stops_answering_is_given_up(fake_bin, monkeypatch):
    stand_in(fake_bin, "squeue", 'echo "slurm_load_jobs error: Unable to contact slurm '
                                 'controller (connect failure)" >&2; exit 1')
    monkeypatch.setattr(slurm, "CONTROLLER_PATIENCE_S", 0.2)
    attempt = Attempt("124")
    slurm._wait(attempt, 3600.0, None, None)
    assert attempt.stopped == "unreachable" and attempt.info.state == "UNREACHABLE"
    assert (fake_bin / "scancelled").read_text() == "124\n"
    status, reason = reason_for(attempt, 3600.0, 60.0, None)
    assert status == "failed" and "the Slurm controller stopped answering" in reason
    assert "Unable to contact slurm controller" in reason and not slurm._in_flight
