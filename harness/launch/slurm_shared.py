"""Whether the compute nodes see a study's run folder: a tiny job looks for a file.

    note = check_shared(cluster, Path("runs/quickstart"))   # None: seen from a node

Every trial's job reads its plan from the trial's folder and writes its record
there, so the run folder must be on storage the compute nodes share (not /tmp or
a login node's own disk). Before a study starts, the tuner writes a file with a
random name into the run folder (or, before it is made, the nearest folder that
exists) and submits one tiny job on the trials' partition (no Python: `test -f`
and `hostname`) that looks for it and writes back. A job that did not find it is
a HarnessError (one line, exit 2, nothing else started). A job that did not get
to run within WAIT_S (a busy queue), or that sbatch would not take as it is, is
a note saying the folder was not checked: the trial's own job says so later, if
it writes nothing this machine sees (training_harness.launch.slurm_record).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
import uuid
from pathlib import Path

from training_harness.core.cluster import ClusterSpec
from training_harness.core.errors import HarnessError
from training_harness.launch import slurm_queue as queue

WAIT_S = 60.0  # for the probe job to be scheduled, run and leave the queue
POLL_S = 0.5


def check_shared(cluster: ClusterSpec, folder: Path, wait_s: float = WAIT_S) -> str | None:
    """None when a job found the file written in `folder`; a note when it could not be
    checked; HarnessError when a compute node does not see the folder."""
    where = next((p for p in (folder, *folder.parents) if p.is_dir()), Path.cwd()).absolute()
    sentinel = where / f".harness-shared-{uuid.uuid4().hex[:12]}"
    seen = sentinel.with_name(sentinel.name + ".seen")
    try:
        sentinel.write_text("written by harness tune, looked for by a job on a compute node\n")
    except OSError as e:
        raise HarnessError(f"{folder}: cannot write there ({e.strerror}); give --out a folder "
                           "you can write, on a file system the compute nodes share") from None
    try:
        return _probe(cluster, folder, sentinel, seen, wait_s)
    finally:
        for path in (sentinel, seen):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def _probe(cluster: ClusterSpec, folder: Path, sentinel: Path, seen: Path,
           wait_s: float) -> str | None:
    flags = {"job-name": "harness-shared-check", "nodes": 1, "ntasks": 1, "time": 1,
             "output": "/dev/null", "error": "/dev/null"}
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        if getattr(cluster, key) is not None:
            flags[key] = getattr(cluster, key)
    script = f"test -f {shlex.quote(str(sentinel))} && hostname > {shlex.quote(str(seen))}"
    argv = ["sbatch", "--parsable", *queue.as_argv(flags), "--wrap", script]
    not_checked = f"the run folder {folder} was not checked for the compute nodes: "
    try:
        with queue.outside_allocation():
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=queue.COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return not_checked + f"sbatch did not answer ({e})"
    if done.returncode:
        return not_checked + f"sbatch would not take a probe job ({queue.error_text(done.stderr)})"
    job_id = done.stdout.strip().split(";")[0]
    give_up = time.monotonic() + wait_s
    info = queue.job_info(job_id)
    while not info.over and time.monotonic() < give_up:
        time.sleep(POLL_S)
        info = queue.job_info(job_id)
    if not info.over:
        queue.cancel(job_id)
        queue.wait_gone(job_id, patience_s=30.0)
        return not_checked + f"its probe job {job_id} did not run within {wait_s:g}s"
    if info.state == "COMPLETED" and seen.exists():
        return None
    if info.state not in ("COMPLETED", "FAILED"):  # the job itself went wrong, not the file
        return not_checked + f"its probe job {job_id} ended {info.state}"
    on = f" on {info.nodes}" if info.nodes else ""
    raise HarnessError(
        f"the run folder {folder.absolute()} is not shared with the compute nodes: job "
        f"{job_id}{on} did not find (or could not write beside) {sentinel.name} written in "
        f"{sentinel.parent}; give --out a folder on a file system the nodes share (not /tmp "
        "or a local disk)")
