"""The record of a trial that left none: its status and reason, from what its ranks left.

training_harness.launch.local calls `decide` when no rank wrote a record (see its module doc for
the statuses). The reason quotes the failing rank's error and the last lines of
its stderr (read from the tails of the logs only: training_harness.launch.rank_logs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training_harness.launch.rank_logs import (
    RankLog,
    agent_root_cause,
    describe_exit,
    log_paths,
    read_rank_logs,
    root_cause,
    tail,
)

STDERR_LINES = 8  # of the failing rank's stderr, in the reason


@dataclass
class Ended:
    """How the launched process ended, as training_harness.launch.local saw it."""

    code: int | None  # the launched process's exit status (negative: a signal)
    timed_out: bool
    running: list[int]  # ranks still running at the deadline
    stopped_at: float  # time.time() when the launcher stopped waiting
    stop_reason: str | None = None  # the caller's `should_stop` asked for it, and why
    # training_harness.launch.log_cap's summary
    logs_cut: dict[str, str] = field(default_factory=dict)
    # (rank, exit code) of the first rank seen to fail, where the launcher watched the
    # ranks itself (forked from the rank server); torchrun's agent.log says it otherwise
    first_failure: tuple[int, int] | None = None


def decide(
    logs: Path, ended: Ended, timeout: float, single: bool, expected_record: bool
) -> tuple[str, str, dict]:
    """Status, reason and extra metrics of a trial that left no record here."""
    code, timed_out, running = ended.code, ended.timed_out, ended.running
    ranks = read_rank_logs(logs)
    extra: dict = {"exit_code": code, "logs": log_paths(ranks)}
    if ended.logs_cut:
        extra["logs_cut"] = ended.logs_cut
    # When the launcher stopped the trial, the errors that stopping caused (a peer
    # went away, raised after the deadline) say nothing about why it hung.
    errors = [r for r in ranks if r.error and not (
        timed_out and (r.is_symptom or (r.timestamp or 0) > int(ended.stopped_at)))]
    oom = next((r for r in errors if r.is_oom), None)
    if oom is None and not timed_out:
        oom = next((r for r in ranks if r.is_oom), None)
    if oom is not None:
        what = oom.error or _oom_line(oom)
        return "oom", with_tail(f"out of memory on {oom.name}: {what}", oom, extra), extra
    cause = root_cause(errors)
    if cause is not None and not cause.is_symptom:
        return "failed", with_tail(f"{cause.name} failed: {cause.error}", cause, extra), extra
    if timed_out:
        extra["ranks_running"] = running
        where = [f"{r.name} {r.where()}" for r in ranks if r.where() and r.rank in running]
        reason = f"no result after {timeout:g} s; the trial was stopped"
        if running:
            reason += f"; ranks still running: {', '.join(map(str, running))}"
        if where:
            reason += f" ({'; '.join(where)})"
        return "timeout", reason, extra
    died = _died(logs, ranks, code, single, ended.first_failure)
    if died is not None:
        text, log = died
        return "failed", with_tail(text, log, extra), extra
    if cause is not None:  # only errors of ranks whose peer went away
        return "failed", with_tail(f"{cause.name} failed: {cause.error}", cause, extra), extra
    if code == 0:
        if not expected_record:
            return "ok", "", extra
        return "failed", "the trial exited cleanly but wrote no record", extra
    agent = RankLog(logs, None, tail(logs / "agent.log"), None, None, None)
    what = "torchrun" if (logs / "agent.log").exists() else "the trial's ranks"
    return "failed", with_tail(f"{what} ended ({describe_exit(code)}) and no rank "
                                "wrote a record", agent, extra), extra


def _died(logs: Path, ranks: list[RankLog], code: int | None, single: bool,
          first_failure: tuple[int, int] | None) -> tuple[str, RankLog | None] | None:
    """The rank that ended without an error file (a signal, a crash in C, os._exit),
    as the launcher saw it fail first, or as torchrun's summary names it (its first
    observed failure)."""
    if single:
        if code in (0, None):
            return None
        text = f"the trial process ended ({describe_exit(code)}) and wrote no record"
        return text, next(iter(ranks), None)
    first = first_failure or agent_root_cause(tail(logs / "agent.log", 64 * 1024))
    if first is None:
        return None
    rank, rank_code = first
    log = next((r for r in ranks if r.rank == rank), None)
    if log is not None and log.error:
        return None  # it raised: its error file says more than its exit code
    return f"rank {rank} ended ({describe_exit(rank_code)}) without raising an error", log


def with_tail(text: str, rank: RankLog | None, extra: dict) -> str:
    """`text` and the end of `rank`'s stderr; its tails go into `extra` (the metrics)."""
    if rank is None or not rank.stderr.strip():
        return text
    extra["stderr_tail"] = rank.stderr[-4000:]
    if rank.traceback:
        extra["traceback_tail"] = rank.traceback[-4000:]  # as run_trial records it
    return f"{text}\nlast lines of its stderr ({rank.folder}):\n{rank.last_lines(STDERR_LINES)}"


def _oom_line(rank: RankLog) -> str:
    lines = [line for line in rank.stderr.splitlines() if "memory" in line.lower()]
    return lines[-1].strip()[:500] if lines else "see its stderr"
