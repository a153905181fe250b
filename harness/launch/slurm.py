"""Launching one trial as one Slurm job, through submitit: local.launch's signature.

    result = launch(prepared, "runs/x", "harness bench runs/x/plan.toml", cluster=spec)
    launcher = launcher_for(spec, "cuda", [8, 16], 900)   # checked: one line, exit 2
    result = rejoin("runs/x")       # a stopped caller's job, waited for again (or None)
    cancel_left("runs/x")           # ...or cancelled, its trial failed meanwhile

The job has as many nodes as the trial's layout needs (training_harness.launch.slurm_queue.
shape_for) and one task a node, which runs training_harness.launch.slurm_job.run_node: the
local launcher for that node (torchrun, static rendezvous on node 0, the node rank
SLURM_NODEID's: ranks 0..k-1 on the first node). So the ranks, their logs and the
record are the same as on one machine; the trial's folder must be on storage the
nodes see (submitit's files for the job are in its slurm/).

Here, in the caller's process, the launcher waits for the job and:
- stops it (scancel) when the trial runs past its timeout counted from the job's
  start, plus STARTUP_S for the job to start the trial and stop it: the trial's
  own launcher normally stops it first and records where its ranks were. When the
  caller's timeout is below the plan's own (the study's deadline is near), the
  trial must end by then, queue included: the job's launcher stops it at that
  moment, and the job is cancelled DEADLINE_GRACE_S later if it still runs;
- stops it when `should_stop` gives a reason (a `pruned` record);
- submits it once more when Slurm ended it for the machine's sake (preempted, a
  node failed), and says so in the record;
- cancels it when the caller is interrupted (Ctrl-C, or SIGTERM while a job is out),
  and leaves it queued never.

The record gets tags["cluster"]: the launcher, job id, node list, each node's name
and each rank's node, partition, queue wait (not in the trial's duration_s) and the
jobs tried; the job's stdout and stderr are copied into the trial's logs/
(slurm-<job>-<task>.out/.err), beside each node's rank logs (logs/node<K>/). A trial
of several nodes that failed or hung is told from every node's logs (training_harness.launch.
slurm_nodes): the rank that failed first on any node, or where each rank was stopped.

The job in flight is written down (slurm/job.json in the trial's folder) as soon as
it is submitted, so a caller killed meanwhile loses nothing: `rejoin` waits for that
job again (as `launch` would have) and returns the same record. The tuner's launcher
(`launcher_for`: a SlurmLauncher, training_harness.launch.launcher's seam) says how many trials
it may keep in flight (`max_jobs`) and how to find and rejoin such jobs (`has_job`,
`rejoin`), or cancel one whose trial another worker failed meanwhile (`cancel_job`).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from training_harness.core.cluster import JOB_MARGIN_S, ClusterSpec
from training_harness.core.errors import HarnessError
from training_harness.core.prepared import PreparedPlan
from training_harness.launch import procs
from training_harness.launch import slurm_nodes as nodes
from training_harness.launch import slurm_queue as queue
from training_harness.launch.launcher import Launcher
from training_harness.launch.local import made_here
from training_harness.launch.slurm_record import (
    Attempt,
    at_time_limit,
    cluster_tag,
    copy_logs,
    reason_for,
    stderr_tail,
)
from training_harness.launch.slurm_shared import check_shared
from training_harness.records.result import TrialResult, read_result
from training_harness.records.run_store import write_atomic

STARTUP_S = 60.0  # job start -> trial start (Python, unpickling, torchrun), and stopping
DEADLINE_GRACE_S = 15.0  # for a job's launcher to stop its trial at the caller's deadline
# How often the job's state is asked for (one squeue call): often at first, when short
# trials end, then less, so as not to load the controller (nor a CPU trial beside it).
POLL_S = (0.5, 5.0)
# Between two asks, whether node 0 has written the trial's record (one stat, no load on
# the controller): the job ends within seconds of it, so the next ask comes at once
# instead of up to POLL_S[1] later.
RECORD_CHECK_S = 0.25
# A controller that has not answered (squeue failing, not "no such job") for this long:
# the job is given up (scancel tried) and recorded, so that no trial waits for ever.
CONTROLLER_PATIENCE_S = 600.0

JOB_FILE = "job.json"  # in the trial's slurm/: the jobs submitted for it (see `rejoin`)

_in_flight: set[str] = set()  # jobs submitted and not yet gone: cancelled at exit


def launcher_for(cluster: ClusterSpec, device_type: str, world_sizes: list[int],
                 trial_timeout_s: float, nnodes: int = 1) -> SlurmLauncher:
    """The launcher for a study's trials (each a job of `nnodes` nodes when more than
    one), once Slurm has said it would take the largest of their jobs (sbatch
    --test-only); else a HarnessError (one line) naming the cause, before anything runs."""
    _submitit()
    shape = queue.shape_for(cluster, device_type, max(world_sizes), nnodes)
    flags = queue.job_flags(cluster, shape, cluster.job_minutes(trial_timeout_s),
                            "harness-check")
    refused = queue.refusal(flags)
    if refused:
        raise HarnessError(
            f"Slurm would not take a trial's job: {refused} (sbatch --test-only "
            f"{' '.join(queue.as_argv(flags))}); fix the [cluster] table (`sinfo -s` lists "
            "the partitions, `sacctmgr show assoc user=$USER` the accounts and QOS)")
    return SlurmLauncher(cluster, nnodes)


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
    cluster: ClusterSpec | None = None,
) -> TrialResult:
    """Run the prepared plan as one Slurm job and return its record (see the module's doc)."""
    plan = prepared.plan
    cluster = cluster or plan.cluster or ClusterSpec(launcher="slurm")
    if node_rank != 0 or rdzv_endpoint:
        raise HarnessError("--node-rank and --rdzv-endpoint are for the local launcher: a "
                           "Slurm job gets all of its nodes at once; run the command once")
    timeout = float(timeout_s or plan.timeout_s)
    minutes = cluster.job_minutes(timeout)
    timeout = max(1.0, min(timeout, minutes * 60 - JOB_MARGIN_S))  # inside the job's limit
    by_deadline = timeout_s is not None and timeout_s < plan.timeout_s
    shape = queue.shape_for(cluster, prepared.device_type, plan.world_size, nnodes)
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").unlink(missing_ok=True)
    prepared.write(out / "prepared.json")  # what every node's launcher reads
    (out / "plan.toml").write_text(plan.to_toml())  # the re-run's, even if no job runs
    name = f"{study or plan.name}-{trial_id}" if trial_id is not None else plan.name
    flags = queue.job_flags(cluster, shape, minutes, name)
    ends_at = time.time() + timeout if by_deadline else None  # the caller's deadline
    args = (str(out / "prepared.json"), str(out), command, study, trial_id, shape.nodes,
            timeout, str(Path(progress_file).absolute()) if progress_file else None,
            str(out / "slurm"), ends_at)
    if progress_file is not None:
        Path(progress_file).unlink(missing_ok=True)

    job = Job(str(out), command, study, trial_id, flags, list(args), timeout,
              datetime.now(UTC).isoformat(timespec="seconds"), cluster.partition)
    wall_deadline = time.monotonic() + timeout + DEADLINE_GRACE_S if by_deadline else None
    return _follow(prepared, job, [], wall_deadline, should_stop)


def has_job(out_dir: str | Path) -> bool:
    """Whether a trial's folder says a job was submitted for it (see `rejoin`)."""
    return (Path(out_dir) / "slurm" / JOB_FILE).is_file()


def rejoin(out_dir: str | Path, *, deadline: float | None = None,
           should_stop: Callable[[], str | None] | None = None) -> TrialResult | None:
    """The record of the trial whose job a stopped caller left in `out_dir`: the job
    waited for as `launch` would have (cancelled at `deadline`, epoch seconds, if it
    still runs then). None when there is nothing to wait for: no job was written
    down, or it has ended and left no record (the trial must run again)."""
    out = Path(out_dir).absolute()
    try:
        saved = json.loads((out / "slurm" / JOB_FILE).read_text())
        job = Job(**saved["job"])
        prepared = PreparedPlan.read(out / "prepared.json")
    except (OSError, ValueError, TypeError, KeyError):
        return None
    attempts = [Attempt(t["job_id"], queue.JobInfo(t["state"], nodes=t["nodes"] or ""),
                        t["stopped"]) for t in saved["jobs"]]
    last = attempts[-1]
    if last.job_id is None:
        return None
    info = queue.job_info(last.job_id)
    if info.over and not (out / "result.json").exists():
        return None
    # To be waited for; its timeout here counts from now (the job's own launcher stops
    # the trial on time: this is the backstop for a node that hangs).
    last.info = None
    _in_flight.add(last.job_id)
    wall_deadline = time.monotonic() + deadline - time.time() if deadline else None
    return _follow(prepared, job, attempts, wall_deadline, should_stop)


def cancel_left(out_dir: str | Path) -> str | None:
    """Cancel the job a stopped caller left in `out_dir` if it is still queued or
    running, and wait until it has left the queue (its nodes' launchers stop the trial's
    processes on the way out); what was done, in words, or None when no job of it runs."""
    try:
        jobs = json.loads((Path(out_dir) / "slurm" / JOB_FILE).read_text())["jobs"]
        job_id = jobs[-1]["job_id"]
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return None
    if job_id is None or queue.job_info(job_id).over:
        return None
    queue.cancel(job_id)
    info = queue.wait_gone(job_id)
    return f"job {job_id} cancelled (scancel; it left the queue {info.state})"


class SlurmLauncher(Launcher):
    """The tuner's Launcher for trials run as Slurm jobs of `cluster`: `launch` below,
    up to [cluster] max_jobs at once (each call waits on its own job: thread safe), a
    stopped tuner's jobs found (`has_job`) and waited for again (`rejoin`), and whether
    the compute nodes see the run folder (training_harness.launch.slurm_shared.check_shared)."""

    may_leave_jobs = True

    def __init__(self, cluster: ClusterSpec, nnodes: int = 1):
        self.cluster = cluster
        self.max_jobs = cluster.max_jobs
        self.nnodes = nnodes  # a study's layout.nnodes: every trial's job spans them

    def launch(self, prepared: PreparedPlan, out_dir: str | Path, command: str,
               **kwargs: Any) -> TrialResult:
        # A study of layout.nnodes > 1 gives every trial its nodes and an endpoint for
        # followers on them (training_harness.tune.recovery.follower); a job has all its nodes
        # and meets on its first one, so only the count is kept.
        if kwargs.get("node_rank", 0) == 0:
            kwargs.pop("node_rank", None)
            kwargs.pop("rdzv_endpoint", None)
        kwargs.setdefault("nnodes", self.nnodes)
        return launch(prepared, out_dir, command, cluster=self.cluster, **kwargs)

    has_job = staticmethod(has_job)
    rejoin = staticmethod(rejoin)
    cancel_job = staticmethod(cancel_left)

    def check_shared(self, run_dir: str | Path) -> str | None:
        return check_shared(self.cluster, Path(run_dir))

    @property
    def name(self) -> str:  # what `harness tune --check` shows
        return "training_harness.launch.slurm:launch"


@dataclass
class Job:
    """What a trial's jobs are submitted with and recorded by: kept in slurm/job.json."""

    out: str
    command: str
    study: str | None
    trial_id: int | str | None
    flags: dict[str, Any]
    args: list[Any]  # run_node's
    timeout: float
    started_at: str
    partition: str | None

    def save(self, attempts: list[Attempt]) -> None:
        write_atomic(Path(self.out) / "slurm" / JOB_FILE,
                     json.dumps({"job": asdict(self), "jobs": [a.as_tag() for a in attempts]}))


def _follow(prepared: PreparedPlan, job: Job, attempts: list[Attempt],
            wall_deadline: float | None,
            should_stop: Callable[[], str | None] | None) -> TrialResult:
    """Submit (unless the last attempt is yet to be waited for), wait, submit once more
    when Slurm ended the job for the machine's sake; then the record."""
    out = Path(job.out)
    with procs.sigterm_as_interrupt():
        while True:
            if not attempts or attempts[-1].info is not None:
                attempts.append(_submit(out / "slurm", job.flags, tuple(job.args)))
                job.save(attempts)  # first, so that a caller killed now loses nothing
            attempt = attempts[-1]
            if attempt.job_id is None:
                break
            _wait(attempt, job.timeout, wall_deadline, should_stop, out / "result.json")
            job.save(attempts)
            ended = attempt.info.state if attempt.info else "UNKNOWN"
            if (attempt.stopped or ended not in queue.RETRIED or len(attempts) >= 2
                    or (out / "result.json").exists()):
                break
    record = _record(prepared, out, job.command, job.study, job.trial_id, job.started_at,
                     attempts, job.timeout)
    last = attempts[-1]
    written = nodes.read_nodes(out, last.job_id)
    names = nodes.node_names(written, last.info.nodes if last.info else "")
    at_time_limit(record, last, job.flags["time"])
    nodes.across_nodes(record, out, names, written)  # a failure or a hang, from every node
    record.tags = {**record.tags, "cluster": cluster_tag(
        job.partition, attempts, names, nodes.rank_nodes(record, out, names))}
    copy_logs(out, attempts)
    record.write(out / "result.json")
    return record


def _submit(folder: Path, flags: dict[str, Any], args: tuple) -> Attempt:
    """One job through submitit; an sbatch refusal is an Attempt without a job id."""
    from training_harness.launch.slurm_job import run_node

    submitit = _submitit()
    flags = dict(flags)
    native = {"job_name": flags.pop("job-name"), "nodes": flags.pop("nodes"),
              "ntasks_per_node": flags.pop("ntasks-per-node"), "time": flags.pop("time")}
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    executor.update_parameters(
        **native, additional_parameters={k.replace("-", "_"): v for k, v in flags.items()})
    said = io.StringIO()
    try:
        # (submitit prints sbatch's complaint too; the record has it)
        with contextlib.redirect_stderr(said), queue.outside_allocation():
            job = executor.submit(run_node, *args)
    except Exception as e:  # submitit's FailedJobError carries sbatch's stderr
        return Attempt(None, why=queue.error_text(str(e) or said.getvalue()) or repr(e))
    _in_flight.add(job.job_id)
    return Attempt(job.job_id)


def _wait(attempt: Attempt, timeout: float, wall_deadline: float | None,
          should_stop: Callable[[], str | None] | None, record: Path | None = None) -> None:
    """Until the job has left the queue; stops it past its time or when asked to. Asked
    again soon once `record` (node 0's result.json) appears: the job is ending."""
    job_id = attempt.job_id
    assert job_id is not None
    started: float | None = None
    answered = time.monotonic()  # when the controller last answered
    done, pause = False, POLL_S[0]
    try:
        while True:
            info = queue.job_info(job_id)
            now = time.monotonic()
            if info.state != "UNREACHABLE":
                answered = now
            if started is None and info.state in ("RUNNING", "COMPLETING"):
                started = now
            if info.over:
                break
            if now - answered > CONTROLLER_PATIENCE_S:
                attempt.stopped, attempt.why = "unreachable", info.reason
            elif info.state == "PENDING" and info.reason in queue.NEVER_RUNS:
                attempt.stopped, attempt.why = "never", info.reason
            elif started is not None and now > started + timeout + STARTUP_S:
                attempt.stopped = "timeout"
            elif wall_deadline is not None and now > wall_deadline:
                attempt.stopped = "deadline"
            elif should_stop is not None and (reason := should_stop()) is not None:
                attempt.stopped, attempt.why = "pruned", reason
            if attempt.stopped:
                queue.cancel(job_id)
                if attempt.stopped != "unreachable":  # (no answer to wait for)
                    info = queue.wait_gone(job_id)
                break
            pause = POLL_S[0] if _nap(pause, record) else min(POLL_S[1], pause * 1.25)
        done = True
    finally:
        if not done:  # interrupted (Ctrl-C): the job goes with us
            queue.cancel(job_id)
            queue.wait_gone(job_id, patience_s=30.0)
        _in_flight.discard(job_id)
    attempt.info = info
    attempt.ran_s = time.monotonic() - started if started is not None else 0.0


def _nap(pause: float, record: Path | None) -> bool:
    """Sleep `pause`, or less when `record` appears meanwhile (looked for every
    RECORD_CHECK_S unless it was there already); whether it appeared."""
    watch = record if record is not None and not record.exists() else None
    until = time.monotonic() + pause
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(RECORD_CHECK_S, left) if watch else left)
        if watch is not None and watch.exists():
            return True
    return False


def _record(prepared: PreparedPlan, out: Path, command: str, study: str | None,
            trial_id: int | str | None, started_at: str, attempts: list[Attempt],
            timeout: float) -> TrialResult:
    """Node 0's record when it wrote one; else one made from what Slurm said."""
    last = attempts[-1]
    result_file = out / "result.json"
    if result_file.exists():  # the trial finished, even if it was about to be stopped
        try:
            return read_result(result_file)
        except (OSError, ValueError, TypeError) as e:
            return made_here(prepared, "failed", f"the record at {result_file} could not be "
                             f"read ({e})", command, study, trial_id, started_at, last.ran_s)
    status, reason = reason_for(last, timeout, STARTUP_S, stderr_tail(out, last.job_id))
    if len(attempts) > 1:
        first = attempts[0]
        reason = (f"{reason} (submitted again after job {first.job_id} ended "
                  f"{first.info.state if first.info else 'UNKNOWN'})")
    return made_here(prepared, status, reason, command, study, trial_id, started_at,
                     last.ran_s)


def _submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise HarnessError("cluster.launcher = 'slurm' needs submitit: pip install submitit "
                           "(or the harness with its dependencies)") from None
    return submitit


@atexit.register
def _cancel_in_flight() -> None:
    """A caller that exits with jobs still out (an error between polls) takes them along."""
    for job_id in sorted(_in_flight):
        queue.cancel(job_id)
