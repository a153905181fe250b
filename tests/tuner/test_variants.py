"""A long budget whose search ended early measures the best with the precisions and
compile modes its space left out (training_harness.tune.final.variants), and gives the rest to
confirmation rounds with longer windows; the named best stays in the study's space."""

from __future__ import annotations

import json

from tests.tuner.conftest import records, study_table, write_study
from training_harness.cli.main import main
from training_harness.tune.final.variants import variants


def test_variants_change_one_precision_or_compile_mode_at_a_time():
    plan = {"strategies": {"amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa"},
                           "checkpoint": {"every": 2}}}
    changes = {v.change: v.strategies for v in variants(plan)}
    assert set(changes) == {
        "precision fp32+TF32", "precision fp16", "precision bf16 + float8 linears",
        "compile mode default", "compile mode max-autotune-no-cudagraphs",
        "compile mode reduce-overhead"}  # bf16 is the best's own precision
    assert changes["precision fp32+TF32"] == {"tf32": {}, "fused": {"attention": "sdpa"},
                                              "checkpoint": {"every": 2}}
    assert changes["compile mode reduce-overhead"]["fused"] == {
        "attention": "sdpa", "compile": True, "compile_mode": "reduce-overhead"}
    assert changes["compile mode reduce-overhead"]["amp"] == {"dtype": "bf16"}
    compiled = {"strategies": {"fused": {"compile": True, "compile_mode": "default"}}}
    assert "compile mode default" not in {v.change for v in variants(compiled)}
    assert "precision bf16" in {v.change for v in variants(compiled)}  # fp32 strict best


def test_a_long_budget_that_converged_measures_the_variants(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_WINDOW_S", "0.01")
    table = study_table(micro_batch_sizes=[8, 16], budget={
        "time": "2h", "ablation_repeats": 1, "confirm_repeats": 1})
    table["strategies"] = {"amp": table["strategies"]["amp"],
                           "fused": {"search": ["attention"]}}
    out = tmp_path / "run"
    assert main(["tune", str(write_study(tmp_path, table)), "--out", str(out), "--launcher",
                 "tests.tuner.fake_launch:launch", "--quiet"]) == 0
    recs = records(out)
    info = json.loads((out / "study.json").read_text())
    assert info["stopped_because"].startswith("search space exhausted")
    ran = info["variants"]
    best = next(r for r in recs if str(r["trial_id"]) == str(ran["of"]))
    assert best["tags"]["phase"] in ("baseline", "known-good", "search")
    assert str(info["best_trial_id"]) == str(ran["of"])  # the best stays in the space
    measured = {r["tags"]["variant"]["change"] for r in recs
                if r["tags"].get("phase") == "variant"}
    expected = {v.change for v in variants(best["plan"])}
    # each variant measured once, or named with why this machine cannot run it
    assert measured | set(ran["refused"]) == expected
    assert not measured & set(ran["refused"])
    assert all(why for why in ran["refused"].values())
    assert "variants" in info["time_spent"]
    # the confirmation rounds beyond confirm_repeats measure longer windows
    later = [r for r in recs if r["tags"].get("phase") == "confirm"
             and r["tags"]["confirm"]["round"] >= 1]
    assert later and all(r["plan"]["min_window_s"] == 4 * 0.01 for r in later)
    if measured:
        assert "variants of trial" in capsys.readouterr().out
