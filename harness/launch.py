"""Launching one trial: its own processes, a hard timeout, and its record collected.

    result = launch(plan, "runs/x", "harness bench runs/x/plan.toml --out runs/x")

The trial never runs in the caller, so nothing it does (a crash, an out-of-memory,
a hang) can take the caller down. The process tree on one node:

    caller (harness bench, the tuner)          waits with a deadline
    └── python -m torch.distributed.run ...    a new session; out/logs/agent.log
        ├── python -m harness.worker ...       rank 0: out/logs/<id>_*/attempt_0/0/
        └── python -m harness.worker ...       rank 1: out/logs/<id>_*/attempt_0/1/

Each rank's folder holds its stdout.log, stderr.log and error.json (torchrun's
--log-dir with --redirects 3; error.json is TORCHELASTIC_ERROR_FILE). A plan with
one rank skips torchrun: `python -m harness.worker` in a new session, its logs in
out/logs/rank0/. On several nodes, each node's launcher keeps its logs in
out/logs/node<N>/.

The record: the worker's own when one was written (ok, oom and diverged come from
the ranks, which agree on them); otherwise the launcher makes one from what the
ranks left: `oom` when a rank's error or stderr says out of memory, `failed` with
the first failing rank's exception (not the errors other ranks saw because it
went away) and the tail of its stderr, `timeout` when the deadline passed first,
naming the ranks still running and where each was stopped. Either way
out/result.json holds the record when launch returns (on node 0).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness import procs
from harness.distributed import NODE_RANK_ENV, free_port
from harness.env import capture_env
from harness.errors import HarnessError
from harness.plan import Plan
from harness.rank_logs import (
    RankLog,
    agent_root_cause,
    describe_exit,
    log_paths,
    read_rank_logs,
    root_cause,
    tail,
)
from harness.result import TrialResult, empty_metrics, read_result
from harness.step_log import STEP_LOG_ENV
from harness.trial import Prepared, prepare

GRACE_S = 5.0  # between SIGTERM and SIGKILL when a trial is stopped
STDERR_LINES = 8  # of the failing rank's stderr, in the reason
POLL_S = 0.25  # how often a waiting launch asks `should_stop`

# torchrun's variables: a launcher inside a torchrun job must not pass its own on.
_TORCHRUN_VARS = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
}


def check_nodes(plan: Plan, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """Refuse a node layout that cannot run `plan` (HarnessError), before anything starts."""
    if nnodes < 1:
        raise HarnessError(f"--nnodes {nnodes}: must be 1 or more")
    if not 0 <= node_rank < nnodes:
        raise HarnessError(f"--node-rank {node_rank}: must be in 0..{nnodes - 1}")
    if plan.world_size % nnodes:
        raise HarnessError(
            f"the plan's {plan.world_size} rank(s) do not split evenly over {nnodes} nodes; "
            "set --nnodes to a divisor of the world size"
        )
    if nnodes > 1 and not rdzv_endpoint:
        raise HarnessError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the same on every node "
            "(node 0's address and a free port)"
        )
    if rdzv_endpoint and not re.fullmatch(r"[^\s:]+:\d+", rdzv_endpoint):
        raise HarnessError(f"--rdzv-endpoint {rdzv_endpoint!r}: write HOST:PORT")


def launch(
    plan: Plan,
    out_dir: str | Path,
    command: str,
    *,
    study: str | None = None,
    trial_id: int | str | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    timeout_s: float | None = None,
    progress_file: str | Path | None = None,
    should_stop: Callable[[], str | None] | None = None,
) -> TrialResult:
    """Run `plan` in its own processes and return its record (see the module's doc).

    A plan this machine refuses raises HarnessError before anything starts. On
    nodes other than 0 the record is made on node 0; this node's result says
    whether its ranks finished.

    For the tuner: with `progress_file`, rank 0 appends each measured step's time
    to it (harness.step_log); `should_stop` is called while the trial runs and,
    when it returns a reason, the trial is stopped and recorded as `pruned` with it.
    """
    prep = prepare(plan)
    check_nodes(prep.plan, nnodes, node_rank, rdzv_endpoint)
    timeout = float(timeout_s or prep.plan.timeout_s)
    out = Path(out_dir).absolute()
    logs = out / "logs" if nnodes == 1 else out / "logs" / f"node{node_rank}"
    result_file = out / "result.json"
    shutil.rmtree(logs, ignore_errors=True)  # a re-used folder: old logs would mislead
    logs.mkdir(parents=True)
    if node_rank == 0:
        result_file.unlink(missing_ok=True)
    plan_file = out / "plan.toml"
    _write(plan_file, prep.plan.to_toml())

    launch_id = uuid.uuid4().hex
    worker = ["-m", "harness.worker", str(plan_file), "--result", str(result_file),
              "--command", command]
    worker += ["--study", study] if study is not None else []
    worker += ["--trial-id", str(trial_id)] if trial_id is not None else []
    single = prep.plan.world_size == 1 and nnodes == 1
    env = _env(launch_id, node_rank)
    if progress_file is not None:
        Path(progress_file).unlink(missing_ok=True)
        env[STEP_LOG_ENV] = str(Path(progress_file).absolute())
    if single:
        argv = [sys.executable, *worker]
        (logs / "rank0").mkdir()
        env["TORCHELASTIC_ERROR_FILE"] = str(logs / "rank0" / "error.json")
        stdout, stderr = logs / "rank0" / "stdout.log", logs / "rank0" / "stderr.log"
    else:
        argv = _torchrun(prep.plan, nnodes, rdzv_endpoint, logs, study, trial_id) + worker
        stdout = stderr = logs / "agent.log"

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    ended = _run(argv, env, stdout, stderr, timeout, launch_id, should_stop)
    duration = time.monotonic() - t0

    if node_rank == 0 and result_file.exists():
        try:
            return read_result(result_file)
        except (OSError, ValueError, TypeError) as e:
            note = f"the record at {result_file} could not be read ({e})"
        return _made_here(prep, "failed", note, {}, command, study, trial_id, started_at,
                          duration, result_file)
    if ended.stop_reason is not None:
        return _made_here(prep, "pruned", ended.stop_reason, {"exit_code": ended.code},
                          command, study, trial_id, started_at, duration,
                          result_file if node_rank == 0 else None)
    status, reason, extra = _decide(logs, ended, timeout, single, node_rank == 0)
    if status == "ok":  # a node other than 0 whose ranks finished
        reason = (f"node {node_rank} of {nnodes}: its ranks finished; the record is made "
                  "on node 0")
        extra["node_rank"] = node_rank
    return _made_here(prep, status, reason, extra, command, study, trial_id, started_at,
                      duration, result_file if node_rank == 0 else None)


@dataclass
class _Ended:
    code: int | None  # the launched process's exit status (negative: a signal)
    timed_out: bool
    running: list[int]  # ranks still running at the deadline
    stopped_at: float  # time.time() when the launcher stopped waiting
    stop_reason: str | None = None  # the caller's `should_stop` asked for it, and why


def _run(argv: list[str], env: dict[str, str], stdout: Path, stderr: Path, timeout: float,
         launch_id: str, should_stop: Callable[[], str | None] | None = None) -> _Ended:
    """Start `argv` in a new session, wait up to `timeout` (or until `should_stop` gives
    a reason), then stop whatever is left."""
    timed_out, running, stop_reason = False, [], None
    deadline = time.monotonic() + timeout
    with open(stdout, "ab") as out_f, open(stderr, "ab") as err_f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                env=env, start_new_session=True)
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    proc.wait(timeout=max(0.0, min(left, POLL_S if should_stop else left)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        timed_out = True
                        running = procs.running_ranks(launch_id)
                        break
                    stop_reason = should_stop() if should_stop else None
                    if stop_reason is not None:
                        break
        finally:  # also when the caller is interrupted: no process outlives the launch
            stopped_at = time.time()
            procs.stop(proc, launch_id, GRACE_S)
    return _Ended(proc.returncode, timed_out, running, stopped_at, stop_reason)


def _decide(
    logs: Path, ended: _Ended, timeout: float, single: bool, expected_record: bool
) -> tuple[str, str, dict]:
    """Status, reason and extra metrics of a trial that left no record here."""
    code, timed_out, running = ended.code, ended.timed_out, ended.running
    ranks = read_rank_logs(logs)
    extra: dict = {"exit_code": code, "logs": log_paths(ranks)}
    # When the launcher stopped the trial, the errors that stopping caused (a peer
    # went away, raised after the deadline) say nothing about why it hung.
    errors = [r for r in ranks if r.error and not (
        timed_out and (r.is_symptom or (r.timestamp or 0) > int(ended.stopped_at)))]
    oom = next((r for r in errors if r.is_oom), None)
    if oom is None and not timed_out:
        oom = next((r for r in ranks if r.is_oom), None)
    if oom is not None:
        what = oom.error or _oom_line(oom)
        return "oom", _with_tail(f"out of memory on {oom.name}: {what}", oom, extra), extra
    cause = root_cause(errors)
    if cause is not None and not cause.is_symptom:
        return "failed", _with_tail(f"{cause.name} failed: {cause.error}", cause, extra), extra
    if timed_out:
        extra["ranks_running"] = running
        where = [f"{r.name} {r.where()}" for r in ranks if r.where() and r.rank in running]
        reason = f"no result after {timeout:g} s; the trial was stopped"
        if running:
            reason += f"; ranks still running: {', '.join(map(str, running))}"
        if where:
            reason += f" ({'; '.join(where)})"
        return "timeout", reason, extra
    died = _died(logs, ranks, code, single)
    if died is not None:
        text, log = died
        return "failed", _with_tail(text, log, extra), extra
    if cause is not None:  # only errors of ranks whose peer went away
        return "failed", _with_tail(f"{cause.name} failed: {cause.error}", cause, extra), extra
    if code == 0:
        if not expected_record:
            return "ok", "", extra
        return "failed", "the trial exited cleanly but wrote no record", extra
    agent = RankLog(logs, None, tail(logs / "agent.log"), None, None, None)
    return "failed", _with_tail(f"torchrun ended ({describe_exit(code)}) and no rank "
                                "wrote a record", agent, extra), extra


def _died(logs: Path, ranks: list[RankLog], code: int | None,
          single: bool) -> tuple[str, RankLog | None] | None:
    """The rank that ended without an error file (a signal, a crash in C, os._exit),
    as torchrun's summary names it (its first observed failure)."""
    if single:
        if code in (0, None):
            return None
        text = f"the trial process ended ({describe_exit(code)}) and wrote no record"
        return text, next(iter(ranks), None)
    first = agent_root_cause(tail(logs / "agent.log", 64 * 1024))
    if first is None:
        return None
    rank, rank_code = first
    log = next((r for r in ranks if r.rank == rank), None)
    if log is not None and log.error:
        return None  # it raised: its error file says more than its exit code
    return f"rank {rank} ended ({describe_exit(rank_code)}) without raising an error", log


def _with_tail(text: str, rank: RankLog | None, extra: dict) -> str:
    if rank is None or not rank.stderr.strip():
        return text
    extra["stderr_tail"] = rank.stderr[-4000:]
    if rank.traceback:
        extra["traceback_tail"] = rank.traceback[-4000:]  # as run_trial records it
    return f"{text}\nlast lines of its stderr ({rank.folder}):\n{rank.last_lines(STDERR_LINES)}"


def _oom_line(rank: RankLog) -> str:
    lines = [line for line in rank.stderr.splitlines() if "memory" in line.lower()]
    return lines[-1].strip()[:500] if lines else "see its stderr"


def _made_here(
    prep: Prepared, status: str, reason: str, extra: dict, command: str, study: str | None,
    trial_id: int | str | None, started_at: str, duration: float, write_to: Path | None,
) -> TrialResult:
    result = TrialResult(
        study=study,
        trial_id=trial_id,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        plan=prep.plan.to_dict(),
        predicted=prep.predicted,
        metrics={**empty_metrics(), **extra},
        env=capture_env(prep.device),
        command=command,
        started_at=started_at,
        duration_s=duration,
    )
    if write_to is not None:
        result.write(write_to)
    return result


def _torchrun(plan: Plan, nnodes: int, endpoint: str | None, logs: Path, study: str | None,
              trial_id: int | str | None) -> list[str]:
    endpoint = endpoint or f"127.0.0.1:{free_port()}"
    host = endpoint.rsplit(":", 1)[0]
    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", f"{study or plan.name}-{trial_id or 0}")
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(plan.world_size // nnodes),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        "--max-restarts", "0",
        "--monitor-interval", "0.1",
        "--log-dir", str(logs),
        "--redirects", "3",
    ]
    if host in ("127.0.0.1", "localhost", "::1"):
        argv += ["--local-addr", "127.0.0.1"]  # the ranks meet on loopback too
    return argv


def _env(launch_id: str, node_rank: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env[procs.LAUNCH_ID_ENV] = launch_id
    env[procs.LAUNCHER_ENV] = procs.launcher_tag()
    env[NODE_RANK_ENV] = str(node_rank)
    env["PYTHONUNBUFFERED"] = "1"
    # The trial imports what the caller could: its working folder and the folders
    # added to its path (a user's workload module), before the child's own.
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    path = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)
                            and not os.path.abspath(p).startswith(prefixes)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    return env


def _write(path: Path, text: str) -> None:
    """Whole or not at all: several nodes' launchers may share the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}")
    tmp.write_text(text)
    os.replace(tmp, path)
