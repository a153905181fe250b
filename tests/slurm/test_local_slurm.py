"""scripts/local-slurm: the clusters the other tests here submit to (one node, or two
named nodes on this machine with `--nodes 2`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import psutil
import pytest

from tests.slurm.conftest import PAIR_CPUS, SCRIPT, _installed, queued


def test_a_job_runs_on_the_local_partition(slurm_partition, tmp_path):
    out = tmp_path / "job.out"
    submitted = subprocess.run(["sbatch", "--parsable", "--partition", slurm_partition, "--output",
                                str(out), "--wrap", "srun echo ran on $SLURM_JOB_NODELIST"],
                               capture_output=True, text=True, check=True)
    job = submitted.stdout.strip()
    while any(line.split()[0] == job for line in queued()):  # (sbatch --wait polls every 10 s)
        time.sleep(0.2)
    assert out.read_text().startswith("ran on ")


@pytest.mark.distributed
def test_two_nodes_each_run_one_task_of_a_job(two_nodes, tmp_path):
    info = subprocess.run(["sinfo", "-h", "-N", "-p", two_nodes, "-o", "%N %T %c"],
                          capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    # LOCAL_SLURM_CPUS_PER_NODE (the fixture's); without it, half of this machine's each
    assert sorted(info) == [f"n1 idle {PAIR_CPUS}", f"n2 idle {PAIR_CPUS}"]
    ran = subprocess.run(["srun", "-p", two_nodes, "-N2", "-n2",
                          "bash", "-c", "echo $SLURM_NODEID $SLURMD_NODENAME"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert sorted(ran.stdout.split("\n")[:-1]) == ["0 n1", "1 n2"]
    for _ in range(240):  # srun returns while Slurm still cleans up after it (COMPLETING)
        if not queued():
            break
        time.sleep(0.25)


def test_without_multiple_slurmd_it_says_so_and_leaves_nothing(tmp_path):
    """A Slurm built without multiple-slurmd support, as its controller says: `start
    --nodes 2` is one line, exit 1, and stops the daemons it had started."""
    if not _installed():
        pytest.skip("slurm-wlm and munge are not installed")
    fake = tmp_path / "bin"
    fake.mkdir()
    real = shutil.which("scontrol")
    (fake / "scontrol").write_text(f'#!/bin/sh\n"{real}" "$@" | grep -v MULTIPLE_SLURMD\n')
    (fake / "scontrol").chmod(0o755)
    folder = tmp_path / "cluster"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
           "LOCAL_SLURM_DIR": str(folder), "LOCAL_SLURM_PARTITION": "nope"}
    env.pop("SLURM_CONF", None)
    done = subprocess.run([str(SCRIPT), "start", "--nodes", "2"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and not done.stdout
    assert done.stderr.count("\n") == 1 and "multiple-slurmd support" in done.stderr
    assert not folder.exists()  # its daemons stopped (by their pid files), its folder gone
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(folder) in " ".join(p.info["cmdline"] or [])]


def test_a_bad_node_count_is_refused(tmp_path):
    done = subprocess.run([str(SCRIPT), "start", "--nodes", "zero"], capture_output=True,
                          text=True, env={**os.environ, "LOCAL_SLURM_DIR": str(tmp_path)})
    assert done.returncode == 1 and "--nodes zero: give a whole number" in done.stderr


@pytest.mark.parametrize("setting, value", [("LOCAL_SLURM_CPUS_PER_NODE", "two"),
                                            ("LOCAL_SLURM_MESSAGE_TIMEOUT_S", "5s")])
def test_a_bad_setting_is_refused(tmp_path, setting, value):
    env = {**os.environ, "LOCAL_SLURM_DIR": str(tmp_path), setting: value}
    done = subprocess.run([str(SCRIPT), "start", "--nodes", "2"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 1 and f"{setting}={value}: give a whole" in done.stderr
    assert not (tmp_path / "slurm.conf").exists()  # refused before anything started
