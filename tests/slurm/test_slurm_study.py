"""A study whose [cluster] says launcher = "slurm": every launched trial is a job of the
local Slurm (two in flight at once), and it ends with a best plan and a report; a
partition Slurm does not have stops it before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w

from harness.cli.main import main

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


@pytest.mark.timeout(240)
def test_a_study_runs_its_trials_as_jobs_and_ends_with_a_report(slurm_partition, tmp_path,
                                                                  capsys):
    run = tmp_path / "run"
    study = write(tmp_path, partition=slurm_partition, max_jobs=2)
    code = main(["tune", str(study), "--out", str(run), "--quiet"])
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    launched = [r for r in records if (run / "trials" / str(r["trial_id"]) / "slurm").exists()]
    assert launched and all(r["status"] == "ok" for r in launched), records
    for r in launched:
        cluster = r["tags"]["cluster"]
        assert cluster["partition"] == slurm_partition and cluster["state"] == "COMPLETED"
        logs = run / "trials" / str(r["trial_id"]) / "logs"
        assert (logs / f"slurm-{cluster['job_id']}-0.out").exists()
    assert len({r["tags"]["cluster"]["job_id"] for r in launched}) == len(launched)
    # A best, unless every trial was measured beside other work (a shared 2-core
    # machine): then the study says so and exits 1, as it does with the local launcher.
    busy = all((r["metrics"].get("interference") or {}).get("flagged") for r in launched)
    assert (code == 0 and (run / "best.toml").exists()) or (code == 1 and busy), code
    assert main(["report", str(run)]) == 0
    assert list(run.glob("*.html")), "no report page"
    capsys.readouterr()


@pytest.mark.timeout(120)
def test_a_partition_slurm_does_not_have_stops_the_study_before_it_starts(
        slurm_partition, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["tune", str(write(tmp_path, partition="nope")), "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid partition specified: nope" in err, err
    assert not run.exists()
