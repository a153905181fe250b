"""A study whose [cluster] names a partition Slurm does not have stops before anything
runs. (STUDY is the Slurm tests' small study.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from training_harness.cli.main import main

STUDY = {
    "name": "on-slurm", "device": "cpu", "global_batch_size": 8, "micro_batch_sizes": [4, 8],
    "warmup_steps": 1, "steps": 3, "workload": {"name": "mlp"},
    "budget": {"time": "3m", "trial_timeout": "60s", "n_trials": 1, "ablation_share": 0.0,
               "ablation_repeats": 0},
    "strategies": {"amp": {"search": ["dtype"], "values": {"dtype": ["bf16"]}}},
}


def write(folder: Path, **cluster) -> Path:
    path = folder / "study.toml"
    path.write_text(tomli_w.dumps({**STUDY, "cluster": {"launcher": "slurm", **cluster}}))
    return path


# A study run through Slurm to its best plan and report: test_slurm_in_flight.py's
# quickstart study (two jobs in flight, each record's job, partition and logs).


@pytest.mark.timeout(120)
def test_a_partition_slurm_does_not_have_stops_the_study_before_it_starts(
        slurm_partition, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["tune", str(write(tmp_path, partition="nope")), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid partition specified: nope" in err, err
    assert not run.exists()
