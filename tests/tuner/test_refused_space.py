"""What the registry refuses for a study's workload is left out of the search space up
front (training_harness.study.refusals), said once with the reason, and never spent on a trial:
layouts whose parallel strategy cannot run, values no layout runs, and values refused
on some layouts only (offered under a per-layout parameter elsewhere)."""

from __future__ import annotations

import pytest

from tests.tuner.conftest import records, study_table, tune, write_study
from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.strategies.compose import reasons_against
from training_harness.study.search_space import SearchSpace
from training_harness.study.study_file import Study

# 3 heads: tensor parallel over 2 ranks cannot give each rank whole heads; a tied head:
# the pipeline cannot put the head and the embedding on two stages.
ODD_GPT = {"name": "gpt", "layers": 2, "heads": 3, "hidden": 96, "seq_len": 32, "vocab": 64}
PARALLEL = {"ddp": {}, "tensor": {}, "pipeline": {}}


def odd_study(workload=None):
    table = study_table(budget={"ablation_repeats": 0})
    table["workload"] = dict(workload or ODD_GPT)
    table["layout"] = {"world_sizes": [1, 2], "tensor": [1, 2], "pipeline": [1, 2]}
    table["strategies"] = {**PARALLEL, "fused": table["strategies"]["fused"]}
    return table


def test_refused_layouts_are_left_out_said_once_and_never_tried(tmp_path, launched, capsys):
    out = tmp_path / "run"
    path = write_study(tmp_path, odd_study())
    assert tune(str(path), "--out", str(out), "--n-trials", "6") == 0
    err = capsys.readouterr().err
    assert err.count("left out of the search space") == 1
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert any(line.startswith("  - layout 1x1x2 (data x pipeline x tensor): tensor parallel "
                               "over 2 ranks needs heads (3) divisible by 2") for line in lines)
    assert any(line.startswith("  - layout 1x2x1") and "tie the LM head" in line
               for line in lines)
    assert any(line.startswith("  - ddp.compression = 'bf16' (") for line in lines)  # a CPU
    recs = records(out)
    assert recs and all(r["tags"].get("pruned") != "refused" for r in recs)
    plans = [r["plan"] for r in recs]
    assert all(p["layout"]["tensor"] == 1 and p["layout"]["pipeline"] == 1 for p in plans)
    assert all(p["strategies"].get("ddp", {}).get("compression") != "bf16" for p in plans)
    assert any(r["status"] == "ok" for r in recs)

    assert tune(str(path), "--out", str(tmp_path / "checked"), "--check") == 0
    said = capsys.readouterr()
    assert "left out of the search space" not in said.err  # --check lists them instead
    assert "left out      layout 1x1x2" in said.out


def test_values_refused_on_some_layouts_are_not_offered_there():
    table = study_table(workload={**ODD_GPT, "heads": 4, "hidden": 128})  # tensor runs
    table["layout"] = {"world_sizes": [4], "tensor": [1, 2]}
    table["strategies"] = {"ddp": {}, "zero": {"search": ["stage"]}, "tensor": {}}
    space = SearchSpace.of(Study.from_dict(table), "cpu")
    assert space.settings["zero"].layout_values == {"d2p1t2": {"stage": [2, 3]}}
    env = RuntimeEnv.detect("cpu")
    configs = space.enumerate()
    for params in configs:
        assert reasons_against(space.plan(params), env) == []
    names = {name for params in configs for name in params}
    # DDP cannot wrap DTensor parameters, nor can zero stage 1: on 2x1x2 only zero 2/3
    assert {"data_parallel", "zero.stage", "zero.stage@d2p1t2"} <= names
    assert "data_parallel@d2p1t2" not in names  # a single choice there: no parameter
    assert {space.plan(p).layout.tensor for p in configs} == {1, 2}


def test_a_study_with_no_layout_left_says_why():
    table = odd_study()
    table["layout"] = {"world_sizes": [2], "tensor": [2]}
    table["strategies"] = {"tensor": {}}
    with pytest.raises(HarnessError, match=r"no layout of the study can run here: 1x1x2: "
                                           r"tensor parallel over 2 ranks needs heads \(3\)"):
        SearchSpace.of(Study.from_dict(table), "cpu")


def test_a_model_that_cannot_take_tensor_parallel_leaves_its_layouts_out():
    from tests.workloads.tiny_hf import TINY_HF, needs_transformers

    needs_transformers()
    table = odd_study({"name": "hf:gpt2", **TINY_HF["gpt2"]})
    space = SearchSpace.of(Study.from_dict(table), "cpu")
    assert [(lay.data, lay.pipeline, lay.tensor) for lay in space.layouts] == [(1, 1, 1),
                                                                                 (2, 1, 1)]
    why = "\n".join(space.left_out)
    assert "layout 1x1x2 (data x pipeline x tensor): tensor parallel: transformers gives " \
           "'gpt2' no base_model_tp_plan, and the harness's own plan cannot split it: its " \
           "layers fuse q, k and v (or gate and up) in one Conv1D (attn.c_attn)" in why
    assert "layout 1x2x1 (data x pipeline x tensor): pipeline: transformers gives 'gpt2' " \
           "no base_model_pp_plan" in why
