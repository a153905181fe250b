"""A study whose every trial spans the two nodes of `two_nodes` (layout.nnodes = 2, one
rank a node): a pipeline across the nodes, one stage a node, one job on n1 and n2, and
a report that lists the trial's nodes. (ZeRO across the nodes, and studies of several
trials on both nodes, are test_two_tuners_postgres.py's.)"""

from __future__ import annotations

import json

import pytest
import tomli_w

from tests.distributed.launch_helpers import TINY, needs_ddp
from training_harness.cli.main import main
from training_harness.reports.export import trial_table
from training_harness.reports.load import load_run

# One configuration: the pipeline across the nodes (1F1B), one stage a node.
STUDY = {
    "name": "two-node-test", "device": "cpu", "global_batch_size": 8,
    "micro_batch_sizes": [4], "warmup_steps": 1, "steps": 2,
    "workload": {"name": "gpt", **TINY, "tie_weights": False},
    "layout": {"world_sizes": [2], "nnodes": 2, "pipeline": [2]},
    "budget": {"time": "6m", "trial_timeout": "2m", "n_trials": 1, "ablation_share": 0.0,
               "ablation_repeats": 0, "confirm_repeats": 0},
    "strategies": {"pipeline": {"search": [], "fixed": {"schedule": "1f1b"}}},
}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_two_node_study_runs_every_trial_on_both_nodes(two_nodes, tmp_path, monkeypatch,
                                                          capsys):
    needs_ddp()
    monkeypatch.setenv("HARNESS_QUIET_SHARE", "1")  # the flow under test, busy or not
    study = tmp_path / "study.toml"
    study.write_text(tomli_w.dumps({**STUDY, "cluster": {"launcher": "slurm",
                                                         "partition": two_nodes}}))
    run = tmp_path / "run"
    code = main(["tune", str(study), "--out", str(run), "--quiet"])
    capsys.readouterr()
    assert code in (0, 1), code  # 1: no best, every figure measured while the machine was busy
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"], [r["reason"] for r in records]
    layouts = {(r["plan"]["layout"]["data"], r["plan"]["layout"]["pipeline"],
                tuple(sorted(r["plan"]["strategies"]))) for r in records}
    assert layouts == {(1, 2, ("pipeline",))}, layouts
    for r in records:
        cluster = r["tags"]["cluster"]
        assert cluster["nodes"] == "n[1-2]" and cluster["node_names"] == ["n1", "n2"]
        # one rank (one stage) a node, by node rank: the first stage on the first node
        assert cluster["rank_nodes"] == ["n1", "n2"] and len(cluster["jobs"]) == 1
        logs = run / "trials" / str(r["trial_id"]) / "logs"
        assert (logs / "node0").is_dir() and (logs / "node1").is_dir()

    assert main(["report", str(run)]) == 0
    capsys.readouterr()
    page = next(run.glob("*.html")).read_text()
    assert "<th data-type=\"text\">nodes</th>" in page and "n1, n2" in page
    assert list(trial_table(load_run(run))["nodes"]) == ["n1, n2"]
