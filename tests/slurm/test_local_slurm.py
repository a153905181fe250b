"""scripts/local-slurm: the single-node cluster the other tests here submit to."""

from __future__ import annotations

import subprocess
import time

from tests.slurm.conftest import queued


def test_a_job_runs_on_the_local_partition(slurm_partition, tmp_path):
    out = tmp_path / "job.out"
    submitted = subprocess.run(["sbatch", "--parsable", "--partition", slurm_partition, "--output",
                                str(out), "--wrap", "srun echo ran on $SLURM_JOB_NODELIST"],
                               capture_output=True, text=True, check=True)
    job = submitted.stdout.strip()
    while any(line.split()[0] == job for line in queued()):  # (sbatch --wait polls every 10 s)
        time.sleep(0.2)
    assert out.read_text().startswith("ran on ")
