"""A real Slurm for these tests (scripts/local-slurm), started once per session: one of a
single node (`slurm_partition`), and, for the tests of trials across nodes, one of two
nodes on this machine (`two_nodes`: n1 and n2, multiple-slurmd). Each has its own
folder, ports and daemons, and is stopped at the end of the session.

Needs Debian's slurm-wlm and munge (.ci/run installs them); without them every test
here is skipped, saying so. After each test the queue must be empty: a test that
leaves a job behind fails (and its jobs are cancelled, so the next starts clean).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
PARTITION = "local"
PAIR = "pair"  # the two-node cluster's partition (its default)
PAIR_CPUS = 3  # CPUs each of its nodes says it has (see `two_node_slurm`)


def _installed() -> bool:
    return all(shutil.which(b) or os.access(f"/usr/sbin/{b}", os.X_OK)
               for b in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch"))


@contextlib.contextmanager
def _cluster(folder: Path, partition: str, nodes: int, **env_more: str) -> Iterator[str]:
    """A local Slurm of `nodes` nodes in `folder` (its own ports and daemons), stopped
    after; yields its SLURM_CONF."""
    if not _installed():
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge; "
                    ".ci/run does): the Slurm launcher's tests need a real Slurm")
    env = {**os.environ, "LOCAL_SLURM_DIR": str(folder), "LOCAL_SLURM_PARTITION": partition,
           **env_more}
    started = subprocess.run([str(SCRIPT), "start", "--nodes", str(nodes)], env=env,
                             capture_output=True, text=True)
    if started.returncode:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True)
        pytest.fail(f"scripts/local-slurm start --nodes {nodes} failed: {started.stderr.strip()}")
    try:
        yield started.stdout.strip().rpartition("=")[2]
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True)


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The partition of a running local Slurm; SLURM_CONF points at it meanwhile."""
    with _cluster(tmp_path_factory.mktemp("slurm"), PARTITION, 1) as conf:
        before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = conf
        try:
            yield PARTITION
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = before


@pytest.fixture(scope="session")
def two_node_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The SLURM_CONF of a running local Slurm of two nodes, n1 and n2, partition PAIR;
    started once, for every test that uses it. Each node says it has PAIR_CPUS (on a
    2-core machine they share the cores), so that two tuners' 2-node jobs and a third
    tuner's probe job (training_harness.launch.slurm_shared) run at once. A node that stops
    answering is set DOWN after 8 s (Slurm's default: 300 s), for the test of a node
    that dies, which waits for Slurm's word: with Slurm's messages waited for 5 s, not
    10 s (MessageTimeout), that came 15 s after the kill, not 28 s (scripts/local-slurm).
    A live slurmd or controller answers within milliseconds, however busy the cores."""
    with _cluster(tmp_path_factory.mktemp("slurm2"), PAIR, 2, LOCAL_SLURM_SLURMD_TIMEOUT_S="8",
                  LOCAL_SLURM_MESSAGE_TIMEOUT_S="5",
                  LOCAL_SLURM_CPUS_PER_NODE=str(PAIR_CPUS)) as conf:
        yield conf


def queued() -> list[str]:
    """Jobs pending, running or completing (squeue's default states)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                         check=True)
    return out.stdout.split("\n")[:-1]


@pytest.fixture
def slurm_partition(local_slurm: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The local partition, for one test that must leave the queue empty. A job's state
    is asked for every 0.5 s to 1 s here (training_harness.launch.slurm.POLL_S, 0.5 s to 5 s
    otherwise): these jobs last seconds, and a wait that had backed off to several
    seconds outlived each by half of that. (Tuners in processes of their own poll as
    users' do.)"""
    from training_harness.launch import slurm

    monkeypatch.setattr(slurm, "POLL_S", (slurm.POLL_S[0], 1.0))
    yield local_slurm
    left = queued()
    if left:
        subprocess.run(["scancel", "--partition", local_slurm], capture_output=True)
        pytest.fail(f"jobs left in the queue after the test: {left}")


@pytest.fixture
def two_nodes(two_node_slurm: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The two-node cluster's partition for one test, which must leave its queue empty
    (polled as `slurm_partition` does)."""
    from training_harness.launch import slurm

    monkeypatch.setenv("SLURM_CONF", two_node_slurm)
    monkeypatch.setattr(slurm, "POLL_S", (slurm.POLL_S[0], 1.0))
    yield PAIR
    left = queued()
    if left:
        subprocess.run(["scancel", "--partition", PAIR], capture_output=True)
        pytest.fail(f"jobs left in the queue after the test: {left}")


def stand_in(folder: Path, name: str, body: str) -> None:
    """A shell script on `folder` (see `fake_bin`) standing in for one of Slurm's commands."""
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder first on PATH (before only /usr/bin and /bin) for `stand_in` commands; a
    stand-in scancel writes its arguments to `scancelled` there. No cluster needed."""
    from training_harness.launch import slurm

    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setattr(slurm, "POLL_S", (0.01, 0.05))
    stand_in(folder, "scancel", f'echo "$@" >> {folder}/scancelled')
    return folder
