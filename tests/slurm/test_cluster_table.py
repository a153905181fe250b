"""The [cluster] table and the shape of a trial's job: no Slurm needed."""

from __future__ import annotations

import pytest

from training_harness.cli.main import main
from training_harness.core.cluster import ClusterSpec
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.launch import slurm_job
from training_harness.launch.slurm_queue import Shape, as_argv, error_text, job_flags, shape_for
from training_harness.study.study_file import Study

STUDY = {"name": "s", "device": "cpu", "budget": {"trial_timeout": "10m"}}


def study_error(cluster: dict, **more) -> str:
    with pytest.raises(HarnessError) as e:
        Study.from_dict({**STUDY, **more, "cluster": cluster}, where="s.toml")
    return str(e.value)


def test_a_study_keeps_its_cluster_table():
    cluster = {"launcher": "slurm", "partition": "gpu", "account": "proj", "qos": "high",
               "gpus_per_node": 8, "cpus_per_task": 16, "time": "30m", "max_jobs": 4,
               "sbatch": ["--exclusive", "--mem=0"]}
    study = Study.from_dict({**STUDY, "cluster": cluster})
    assert Study.from_dict(study.to_dict()).cluster == study.cluster == ClusterSpec(**cluster)
    assert Study.from_dict(STUDY).cluster is None  # no table: this machine, as before
    assert "cluster" not in Plan().to_dict()


@pytest.mark.parametrize("cluster, more, says", [
    ({"launcher": "slurmm"}, {}, "s.toml.cluster.launcher: 'slurmm' is not one of"),
    ({"partion": "gpu"}, {}, "unknown key 'partion' (did you mean 'partition'?)"),
    ({"max_jobs": 0}, {}, "s.toml.cluster.max_jobs: must be between 1"),
    ({"gpus_per_node": 0}, {}, "s.toml.cluster.gpus_per_node: must be between 1"),
    ({"partition": "a b"}, {}, "s.toml.cluster.partition: 'a b' must be a Slurm name"),
    ({"time": "soon"}, {}, "s.toml.cluster.time 'soon': write a positive duration"),
    ({"sbatch": ["exclusive"]}, {}, "s.toml.cluster.sbatch[0]: 'exclusive': write sbatch's"),
    ({"sbatch": ["--partition=gpu"]}, {}, "set s.toml.cluster.partition, not in sbatch"),
    ({"sbatch": ["-N", "2"]}, {}, "the launcher sets it for each trial"),
    ({"launcher": "slurm", "time": "10m"}, {},
     "must outlast the trial's budget.trial_timeout (600s) by 120s"),
    ({"launcher": "slurm", "gpus_per_node": 2}, {"layout": {"nnodes": 2, "world_sizes": [8]}},
     "s.toml.layout.nnodes: 8 ranks on 2 nodes need more than gpus_per_node = 2 a node"),
])
def test_a_bad_cluster_table_names_the_key(cluster, more, says):
    assert says in study_error(cluster, **more)


def test_a_study_of_several_nodes_may_run_each_trial_as_one_job():
    study = Study.from_dict({**STUDY, "cluster": {"launcher": "slurm"},
                             "layout": {"nnodes": 2, "world_sizes": [2]}})
    assert study.layout.nnodes == 2 and study.cluster.launcher == "slurm"


def test_bench_refuses_a_bad_cluster_table_in_one_line(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "p"\n[cluster]\nlauncher = "slurm"\nmax_jobs = "many"\n')
    assert main(["bench", str(plan), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cluster.max_jobs" in err
    assert not (tmp_path / "out").exists()


def test_a_trial_gets_the_nodes_its_layout_needs():
    gpu = ClusterSpec(launcher="slurm", gpus_per_node=8)
    assert shape_for(gpu, "cuda", 16) == Shape(2, 8, 8)
    assert shape_for(gpu, "cuda", 12) == Shape(2, 6, 6)  # the same ranks on every node
    assert shape_for(gpu, "cuda", 2) == Shape(1, 2, 2)  # asks for the GPUs it uses
    assert shape_for(gpu, "cpu", 4) == Shape(1, 4, None)
    assert shape_for(ClusterSpec(), "cpu", 4, nnodes=2) == Shape(2, 2, None)


def test_the_job_flags():
    spec = ClusterSpec(launcher="slurm", partition="gpu", reservation="r", cpus_per_task=16,
                       sbatch=["--exclusive", "--mem=0"])
    flags = job_flags(spec, Shape(2, 8, 8), 17, "s-3")
    assert as_argv(flags) == [
        "--job-name=s-3", "--nodes=2", "--ntasks-per-node=1", "--time=17", "--no-requeue",
        "--partition=gpu", "--reservation=r", "--gpus-per-node=8", "--cpus-per-task=16",
        "--exclusive", "--mem=0"]
    assert ClusterSpec().job_minutes(900) == 17  # the timeout and the margin, rounded up
    assert ClusterSpec(time="1h").job_minutes(900) == 60


def test_sbatch_errors_become_one_line():
    text = ("sbatch: error: invalid partition specified: nope\n"
            "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    assert error_text(text) == ("invalid partition specified: nope; Batch job submission "
                                "failed: Invalid partition name specified")


def test_the_nodes_meet_where_node_0_says(tmp_path):
    at0 = slurm_job._endpoint(tmp_path, 0, "7")
    host, port = at0.rsplit(":", 1)
    assert host and int(port) > 0
    assert slurm_job._endpoint(tmp_path, 1, "7") == at0


def test_a_cuda_trial_counts_the_gpus_slurm_gave_its_node(monkeypatch):
    # (the local launcher in the job checks the node's ranks against them)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [g["id"] for g in slurm_job.node_gpus()] == ["2", "3"]


def test_a_job_does_not_inherit_the_tuners_allocation(monkeypatch):
    import os

    from training_harness.launch.slurm_queue import outside_allocation

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "64")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    monkeypatch.setenv("SBATCH_ACCOUNT", "proj")  # the user's own default: kept
    with outside_allocation():
        assert "SLURM_CPUS_PER_TASK" not in os.environ and "CUDA_VISIBLE_DEVICES" not in os.environ
        assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
        assert os.environ["SBATCH_ACCOUNT"] == "proj"
    assert os.environ["SLURM_CPUS_PER_TASK"] == "64" and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
