"""Launching one trial: its own processes, a hard timeout, and its record collected.

    result = launch(prepared, "runs/x", "harness bench runs/x/plan.toml --out runs/x")

`prepared` is the plan checked once (training_harness.core.prepared: by `harness bench`, or
the tuner's torch-side helper); it is written beside plan.toml as prepared.json,
which every rank reads. This module imports no torch: the tuner calls it.

The trial never runs in the caller, so nothing it does (a crash, an out-of-memory,
a hang) can take the caller down. On one node every rank is a fresh fork of the
rank server (training_harness.launch.rank_server: a forkserver that imported torch once),
each in a session of its own, with the environment torchrun would give it:

    caller (harness bench, the tuner)          waits with a deadline, watches the ranks
    └── python -m multiprocessing.forkserver   the rank server (never runs a trial)
        ├── rank 0 (a fork: training_harness.measure.rank_main)   out/logs/rank0/
        └── rank 1 (a fork: training_harness.measure.rank_main)   out/logs/rank1/

Each rank's folder holds its stdout.log, stderr.log and error.json
(TORCHELASTIC_ERROR_FILE). As torchrun's agent would, the launcher stops the
other ranks as soon as one fails. On several nodes, or with HARNESS_FORK_RANKS=0,
the ranks go through torchrun instead (one rank alone: `python -m
training_harness.measure.rank_main` in a new session, its logs in out/logs/rank0/):

    caller                                     waits with a deadline
    └── python -m training_harness.launch.torchrun_agent ...   torchrun, in a new session;
    out/logs/agent.log
        ├── python -m training_harness.measure.rank_main ...       rank 0:
        out/logs/<id>_*/attempt_0/0/
        └── python -m training_harness.measure.rank_main ...       rank 1:
        out/logs/<id>_*/attempt_0/1/

(torchrun's --log-dir with --redirects 3). On several nodes, each node's launcher
keeps its logs in out/logs/node<N>/. Which ranks run on which node: with the c10d
rendezvous (the default, `harness bench --nnodes`), the order the nodes' launchers
arrived in; with rdzv_backend="static" (a Slurm job's nodes: training_harness.launch.slurm_job),
node_rank's, as torchrun's --node-rank gives it: ranks 0..k-1 on node 0, k..2k-1 on
node 1, the rendezvous endpoint being node 0's address (torchrun's --master-addr and
--master-port).

The record: the worker's own when one was written (ok, oom and diverged come from
the ranks, which agree on them); otherwise the launcher makes one from what the
ranks left: `oom` when a rank's error or stderr says out of memory, `failed` with
the first failing rank's exception (not the errors other ranks saw because it
went away) and the tail of its stderr, `timeout` when the deadline passed first,
naming the ranks still running and where each was stopped. Either way
out/result.json holds the record when launch returns (on node 0).

A trial that floods its output costs the launcher neither memory nor the disk:
the launcher reads only the logs' tails (training_harness.launch.rank_logs), and while the trial
runs it cuts any of its log files (the ones above, agent.log included) that grows
past 64 MiB (training_harness.launch.log_cap.LOG_CAP_BYTES; the environment variable
HARNESS_LOG_CAP_BYTES overrides it), keeping the file's first lines, one marker
line saying where it was cut, and its latest output; the record of a failure made
here names the files cut (metrics["logs_cut"]).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.ports import free_port
from training_harness.core.prepared import PreparedPlan
from training_harness.launch import procs, rank_server
from training_harness.launch.launcher import Launcher
from training_harness.launch.log_cap import LogCap
from training_harness.launch.verdict import Ended, decide
from training_harness.measure.compile_cost import inductor_cache_env
from training_harness.measure.rank_process import (
    LAUNCH_ID_ENV,
    LAUNCHER_ENV,
    NODE_RANK_ENV,
    STACKS_DIR_ENV,
)
from training_harness.records.result import TrialResult, read_result
from training_harness.records.run_store import write_atomic
from training_harness.records.step_log import STEP_LOG_ENV

RDZV_BACKENDS = ("c10d", "static")  # torchrun's, on several nodes (see `launch`)
GRACE_S = 5.0  # between SIGTERM and SIGKILL when a trial is stopped
POLL_S = 0.25  # how often a waiting launch asks `should_stop` (and looks at its logs)

# torchrun's variables: a launcher inside a torchrun job must not pass its own on.
_TORCHRUN_VARS = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
}


def check_nodes(
    plan: Plan, nnodes: int, node_rank: int, rdzv_endpoint: str | None, gpus: int | None = None
) -> None:
    """Refuse a node layout that cannot run `plan` (HarnessError), before anything starts.

    `gpus`: the CUDA devices this node has, for a plan on CUDA (None otherwise); NCCL
    refuses two ranks on one device, so each rank of the node needs its own."""
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
    per_node = plan.world_size // nnodes
    if gpus is not None and per_node > gpus:
        raise HarnessError(
            f"the plan's {plan.world_size} rank(s) need {per_node} GPU(s) per node and this "
            f"node has {gpus}: shrink the [layout], spread it with --nnodes, or set "
            "device = 'cpu'"
        )


def visible_gpus(prepared: PreparedPlan) -> int | None:
    """The CUDA devices the prepared plan saw on this node; None for a CPU plan."""
    if prepared.device_type != "cuda":
        return None
    return len(prepared.env.get("gpus") or []) or None


def launch(
    prepared: PreparedPlan,
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
    rdzv_backend: str = "c10d",
) -> TrialResult:
    """Run the prepared plan in its own processes and return its record (see the
    module's doc).

    `rdzv_backend` (several nodes): "c10d", the nodes' ranks in the order their
    launchers arrive, or "static", node `node_rank` runs ranks node_rank*k..(node_rank+1)*k-1
    and `rdzv_endpoint` is node 0's address, where it listens (a Slurm job's nodes,
    whose node_rank is SLURM_NODEID).

    A node layout that cannot run the plan raises HarnessError before anything starts. On
    nodes other than 0 the record is made on node 0; this node's result says
    whether its ranks finished.

    For the tuner: with `progress_file`, rank 0 appends each measured step's time
    to it (training_harness.records.step_log); `should_stop` is called while the trial runs and,
    when it returns a reason, the trial is stopped and recorded as `pruned` with it.
    """
    plan = prepared.plan
    check_nodes(plan, nnodes, node_rank, rdzv_endpoint, visible_gpus(prepared))
    if rdzv_backend not in RDZV_BACKENDS:
        raise HarnessError(f"rdzv_backend {rdzv_backend!r}: one of {', '.join(RDZV_BACKENDS)}")
    timeout = float(timeout_s or plan.timeout_s)
    out = Path(out_dir).absolute()
    logs = out / "logs" if nnodes == 1 else out / "logs" / f"node{node_rank}"
    caps = LogCap(logs)  # a bad HARNESS_LOG_CAP_BYTES refuses here, before anything starts
    result_file = out / "result.json"
    shutil.rmtree(logs, ignore_errors=True)  # a re-used folder: old logs would mislead
    logs.mkdir(parents=True)
    if node_rank == 0:
        result_file.unlink(missing_ok=True)
    write_atomic(out / "plan.toml", plan.to_toml())  # several nodes' launchers may share it
    prepared_file = out / "prepared.json"
    prepared.write(prepared_file)

    launch_id = uuid.uuid4().hex
    worker = ["-m", "training_harness.measure.rank_main", str(prepared_file), "--result",
              str(result_file),
              "--command", command]
    worker += ["--study", study] if study is not None else []
    worker += ["--trial-id", str(trial_id)] if trial_id is not None else []
    single = plan.world_size == 1 and nnodes == 1
    env = _env(launch_id, node_rank, logs)
    env.update(allocator_env(plan, env))
    env.update(inductor_cache_env(out, study, env))  # the study's own inductor cache
    if progress_file is not None:
        Path(progress_file).unlink(missing_ok=True)
        env[STEP_LOG_ENV] = str(Path(progress_file).absolute())
    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", f"{study or plan.name}-{trial_id or 0}")
    fork = nnodes == 1 and rank_server.enabled() and (
        single or prepared.device_type in ("cpu", "cuda"))  # check_nodes: a GPU per rank

    def start() -> Any:
        if fork:  # every rank forked from the rank server
            return rank_server.start_ranks(worker[2:], env, logs, plan.world_size,
                                           free_port(), run_id)
        if single:
            (logs / "rank0").mkdir()
            one = rank_server.rank_env(env, 0, 1, logs, 0, run_id)
            return _popen([sys.executable, *worker], one, logs / "rank0" / "stdout.log",
                          logs / "rank0" / "stderr.log")
        argv = _torchrun(plan, nnodes, rdzv_endpoint, logs, run_id, rdzv_backend,
                         node_rank) + worker
        return _popen(argv, env, logs / "agent.log", logs / "agent.log")

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    ended = _run(start, timeout, launch_id, env[STACKS_DIR_ENV], caps, should_stop)
    duration = time.monotonic() - t0

    if node_rank == 0 and result_file.exists():
        try:
            return read_result(result_file)
        except (OSError, ValueError, TypeError) as e:
            note = f"the record at {result_file} could not be read ({e})"
        return made_here(prepared, "failed", note, command, study, trial_id, started_at,
                         duration, write_to=result_file)
    if ended.stop_reason is not None:
        return made_here(prepared, "pruned", ended.stop_reason, command, study, trial_id,
                         started_at, duration, {"exit_code": ended.code},
                         result_file if node_rank == 0 else None)
    status, reason, extra = decide(logs, ended, timeout, single, node_rank == 0)
    if status == "ok":  # a node other than 0 whose ranks finished
        reason = (f"node {node_rank} of {nnodes}: its ranks finished; the record is made "
                  "on node 0")
        extra["node_rank"] = node_rank
    return made_here(prepared, status, reason, command, study, trial_id, started_at, duration,
                     extra, result_file if node_rank == 0 else None)


class LocalLauncher(Launcher):
    """`launch` above as the tuner's Launcher: the trial's processes on this machine,
    one trial at a time, nothing that outlives the caller (the Launcher defaults)."""

    def launch(self, prepared: PreparedPlan, out_dir: str | Path, command: str,
               **kwargs: Any) -> TrialResult:
        return launch(prepared, out_dir, command, **kwargs)

    @property
    def name(self) -> str:
        return "training_harness.launch.local:launch"


def _popen(argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> Any:
    # Appending (O_APPEND): the trial carries on at the end of a file that was cut.
    with open(stdout, "ab") as out_f, open(stderr, "ab") as err_f:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                env=env, start_new_session=True)


def _run(start: Callable[[], Any], timeout: float, launch_id: str, stacks_dir: str,
         caps: LogCap, should_stop: Callable[[], str | None] | None = None) -> Ended:
    """Start the trial (`start`: a Popen, or rank_server.ForkedRanks), wait up to
    `timeout`, until it ended (forked ranks: all, or the first to fail) or until
    `should_stop` gives a reason, then stop whatever is left; meanwhile keep the logs
    under their cap."""
    timed_out, running, stop_reason = False, [], None
    deadline = time.monotonic() + timeout
    proc, stopped_at = None, time.time()
    try:
        proc = start()
        forked = isinstance(proc, rank_server.ForkedRanks)
        known = proc.pids if forked else None  # a fork's /proc environment is the server's
        while True:
            left = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(0.0, min(left, POLL_S)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    timed_out = True
                    running = sorted(procs.workers(launch_id, known))
                    procs.dump_stacks(launch_id, stacks_dir, known=known)  # where each was
                    break
                stop_reason = should_stop() if should_stop else None
                if stop_reason is not None:
                    break
                caps.check()
    finally:  # also when the caller is interrupted: no process outlives the launch
        stopped_at = time.time()
        if proc is not None:
            procs.stop(list(proc.members.values()) if forked else [proc], launch_id, GRACE_S)
        caps.check(force=True)  # nothing writes now: the tails kept are the last
    return Ended(proc.returncode, timed_out, running, stopped_at, stop_reason, caps.summary(),
                 proc.first_failure if forked else None)


def made_here(prepared: PreparedPlan, status: str, reason: str, command: str,
              study: str | None, trial_id: int | str | None, started_at: str | None,
              duration_s: float, metrics: dict | None = None,
              write_to: Path | None = None) -> TrialResult:
    """The record of a trial that left none of its own, made by its launcher (this one's
    or Slurm's: training_harness.launch.slurm); written to `write_to` where given."""
    result = TrialResult.not_measured(
        status, reason, study=study, trial_id=trial_id,  # type: ignore[arg-type]
        plan=prepared.plan.to_dict(), predicted=prepared.predicted, env=prepared.env,
        command=command, started_at=started_at or None, duration_s=duration_s,
        metrics=metrics)
    if write_to is not None:
        result.write(write_to)
    return result


def _torchrun(plan: Plan, nnodes: int, endpoint: str | None, logs: Path, run_id: str,
              backend: str = "c10d", node_rank: int = 0) -> list[str]:
    endpoint = endpoint or f"127.0.0.1:{free_port()}"
    host, port = endpoint.rsplit(":", 1)
    argv = [
        sys.executable, "-m", "training_harness.launch.torchrun_agent",  # torch.distributed.run
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(plan.world_size // nnodes),
    ]
    if backend == "static":  # the group rank is the node's: node 0 hosts the store
        argv += ["--rdzv-backend", "static", "--node-rank", str(node_rank),
                 "--master-addr", host, "--master-port", port]
    else:  # the group rank is the order of arrival
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    argv += [
        "--rdzv-id", run_id,
        "--max-restarts", "0",
        "--monitor-interval", "0.1",
        "--log-dir", str(logs),
        "--redirects", "3",
    ]
    if host in ("127.0.0.1", "localhost", "::1"):
        argv += ["--local-addr", "127.0.0.1"]  # the ranks meet on loopback too
    return argv


def _env(launch_id: str, node_rank: int, logs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env[LAUNCH_ID_ENV] = launch_id
    env[LAUNCHER_ENV] = procs.launcher_tag()
    env[STACKS_DIR_ENV] = str(logs)
    env[NODE_RANK_ENV] = str(node_rank)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(import_path(env.get("PYTHONPATH")))
    return env


ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def allocator_env(plan: Plan, env: dict[str, str]) -> dict[str, str]:
    """The CUDA caching allocator's settings for a trial: expandable_segments:True by
    default (less cache held for nothing between differently sized blocks), none where the
    plan turns it off (a study's budget.expandable_segments = false). A setting of
    expandable_segments already in the environment is the user's and is kept."""
    conf = env.get(ALLOC_CONF_ENV, "")
    if not plan.expandable_segments or "expandable_segments" in conf:
        return {ALLOC_CONF_ENV: conf} if conf else {}
    return {ALLOC_CONF_ENV: ",".join(p for p in (conf, "expandable_segments:True") if p)}


def import_path(pythonpath: str | None = None) -> list[str]:
    """What a child process must import from to see what this one could: the working
    folder and the folders added to this process's path (a user's workload module),
    before the child's own."""
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    path = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)
                            and not os.path.abspath(p).startswith(prefixes)]
    if pythonpath:
        path.append(pythonpath)
    return list(dict.fromkeys(path))

