"""The page of a time-to-loss study: validation loss against wall-clock and samples, the
steps-to-target table by global batch and technique, time to target in the headline, a
miss shown as the loss it reached, and two times within the seeds' spread said to be so."""

from __future__ import annotations

import json

from tests.reports.runs import synthetic_records, write_run
from training_harness.reports import figures_convergence as fc
from training_harness.reports.load import load_run
from training_harness.reports.report import build_report


def convergence(optimizer: str, batch: int, steps: list[int | None], step_s: float) -> dict:
    runs = []
    for seed, n in enumerate(steps):
        end = n or 40
        curve = [{"step": s, "samples": s * batch, "train_s": s * 0.01,
                  "val_loss": 5.0 - 3.0 * s / (n or 80), "train_loss": None}
                 for s in range(0, end + 1, 10)]
        runs.append({"seed": seed, "reached": n is not None, "steps_to_target": n,
                     "samples_to_target": n and n * batch, "best_val_loss": curve[-1]["val_loss"],
                     "stopped": "reached" if n else "max_samples", "curve": curve})
    reached = all(n is not None for n in steps)
    times = [n * step_s for n in steps if n is not None]
    return {"target_loss": 2.0, "reached": reached, "optimizer": optimizer, "global_batch": batch,
            "step_time_s": step_s, "seeds": list(range(len(steps))),
            "steps_to_target": sorted(steps)[len(steps) // 2] if reached else None,
            "samples_to_target": sorted(steps)[len(steps) // 2] * batch if reached else None,
            "time_to_target_s": sorted(times)[len(times) // 2] if reached else None,
            "time_spread_s": [min(times), max(times)] if reached else None,
            "best_val_loss": min(r["best_val_loss"] for r in runs), "runs": runs}


def test_a_time_to_loss_page(tmp_path):
    recs = [r for r in synthetic_records(6, ablation=False) if r["status"] == "ok"][:4]
    recs[0]["metrics"]["convergence"] = convergence("adamw", 16, [100, 110, 120], 0.01)
    recs[1]["metrics"]["convergence"] = convergence("lamb", 16, [90, 105, 130], 0.01)
    recs[2]["metrics"]["convergence"] = convergence("adamw", 64, [40, 42, 44], 0.05)
    recs[3]["metrics"]["convergence"] = convergence("lamb", 64, [None, 50, 52], 0.05)
    run = load_run(write_run(tmp_path / "run", recs, objective="time_to_loss"))
    page = build_report(run)
    for key in ('id="ttl_time"', 'id="ttl_samples"', 'id="ttl_table"',
                "time to validation loss 2"):
        assert key in page
    best, note = fc.fastest(run)
    assert (best.optimizer, best.batch, best.time_s) == ("lamb", 16, 1.05)
    assert "within the spread" in note  # adamw at 16: 1.1 s, inside lamb's 0.9-1.3 s
    table = fc.steps_table(run)
    assert "missed (best" in table  # lamb at batch 64: one seed missed, not a success
    assert "105 steps, 1680 samples" in table


def test_the_confirmation_rounds_give_the_headline_its_time(tmp_path):
    import copy

    from training_harness.reports.headline import headline

    recs = [r for r in synthetic_records(6, ablation=False) if r["status"] == "ok"][:2]
    recs[0]["tags"]["phase"] = "baseline"
    recs[0]["metrics"]["convergence"] = convergence("adamw", 16, [100, 110, 120], 0.01)
    recs[1]["metrics"]["convergence"] = convergence("lamb", 16, [90, 105, 130], 0.01)
    for r in recs:
        r["metrics"]["time_to_target_s"] = r["metrics"]["convergence"]["time_to_target_s"]
    rounds = []
    for r in recs:  # the same steps from the cache, a slower step time measured again
        again = copy.deepcopy(r)
        again["trial_id"] = f"confirm-{r['trial_id']}-0"
        again["tags"] = {"phase": "confirm", "confirm": {"of": r["trial_id"], "round": 0}}
        again["metrics"]["convergence"]["time_to_target_s"] *= 2
        rounds.append(again)
    decision = {"objective": "time_to_loss", "best": str(recs[1]["trial_id"]), "median": 1.2,
                "n": 3, "indistinguishable": [], "baseline_id": str(recs[0]["trial_id"]),
                "baseline": {"median": 1.5, "min": 1.1, "max": 2.2, "n": 3}, "standings": {}}
    run = load_run(write_run(tmp_path / "run", recs + rounds, objective="time_to_loss",
                             best_trial_id=recs[1]["trial_id"],
                             baseline_trial_id=recs[0]["trial_id"], best_by_repeats=decision))
    assert {p.trial_id for p in fc.points(run)} == {str(r["trial_id"]) for r in recs}
    best, note = fc.fastest(run)
    assert best.trial_id == str(recs[1]["trial_id"]) and best.time_s == 1.2  # the rounds'
    assert "median over 3 measurements" in note and "ahead of the other" in note
    h = headline(run)  # the baseline's time to target over the best's, not samples/s
    assert h.speedup == 1.5 / 1.2 and h.basis.startswith("time to target: medians")
    assert "within the spread" not in h.basis
    # as training_harness.tune.final.confirmation.decide says it
    decision["baseline_within_spread"] = True
    (tmp_path / "run" / "study.json").write_text(json.dumps(
        {**json.loads((tmp_path / "run" / "study.json").read_text()),
         "best_by_repeats": decision}))
    assert "its lead over the baseline is within the spread" in headline(
        load_run(tmp_path / "run")).basis


def test_techniques_beside_the_same_optimizer_are_their_own_columns_and_legends(tmp_path):
    """A curriculum or EMA run trains with AdamW too: the table and the curves tell them
    from plain AdamW by the record's technique (older records: the optimizer alone)."""
    recs = [r for r in synthetic_records(6, ablation=False) if r["status"] == "ok"][:3]
    recs[0]["metrics"]["convergence"] = convergence("adamw", 16, [100, 110, 120], 0.01)
    recs[1]["metrics"]["convergence"] = {**convergence("adamw", 16, [60, 70, 80], 0.01),
                                         "technique": "adamw + curriculum"}
    recs[2]["metrics"]["convergence"] = {**convergence("muon", 16, [80, 90, 95], 0.01),
                                         "technique": "muon + averaging"}
    run = load_run(write_run(tmp_path / "run", recs, objective="time_to_loss"))
    table = fc.steps_table(run)
    for column in ("<th>adamw</th>", "<th>adamw + curriculum</th>", "<th>muon + averaging</th>"):
        assert column in table
    assert "70 steps, 1120 samples" in table and "110 steps, 1760 samples" in table
    best, _ = fc.fastest(run)
    assert best.technique == "adamw + curriculum"
    legends = {t.name for t in fc.loss_vs_samples(run).fig.data if t.showlegend}
    assert any("adamw + curriculum batch 16" in name for name in legends)


def test_a_folder_of_bench_runs_names_them_by_folder_and_their_workloads(tmp_path):
    """tests/benchmarks/time_to_loss_techniques.py writes one bench folder per row, two
    workloads among them: the page names each by its folder, each column by workload."""
    recs = [r for r in synthetic_records(6, ablation=False) if r["status"] == "ok"][:2]
    recs[0]["metrics"]["convergence"] = convergence("adamw", 16, [100, 110, 120], 0.01)
    recs[1]["metrics"]["convergence"] = {**convergence("adamw", 16, [60, 70, 80], 0.01),
                                         "technique": "adamw + lora"}
    recs[1]["plan"]["workload"] = {"name": f"hf:{tmp_path}/saved/base", "seq_len": 64}
    for name, rec in zip(["adamw", "lora-8"], recs, strict=True):
        rec.pop("trial_id", None)
        rec["study"] = None  # as harness bench writes it
        (tmp_path / "rows" / name).mkdir(parents=True)
        (tmp_path / "rows" / name / "result.json").write_text(json.dumps(rec))
    run = load_run(tmp_path / "rows")
    assert set(run.records) == {"adamw", "lora-8"} and run.name == "rows"
    table = fc.steps_table(run)
    assert "<th>gpt: adamw</th>" in table and "<th>hf:base: adamw + lora</th>" in table
    assert fc.fastest(run)[0].trial_id == "lora-8"
