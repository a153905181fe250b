"""Issue 38's study (tests/fixtures/issue38-quickstart, made from the issue's table): the
tuner's summary, the report and `harness compare` tell one story. Its search alone said
1.11x and its ablation -0.6%; pooled, every output says not distinguishable, with the
same interval. Nothing here runs or times a trial."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from training_harness.records.verdict import study_verdict
from training_harness.reports.compare import build_compare, ratio_lines
from training_harness.reports.effects import technique_effects
from training_harness.reports.headline import headline
from training_harness.reports.load import load_run
from training_harness.reports.report import build_report
from training_harness.tune.final.summary import ablation_table, table, verdict_text

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "issue38-quickstart"
INTERVAL = "1.06x (95% interval [0.95, 1.16], 5 and 5 measurements)"
SAME = "not distinguishable at this n"


def records() -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / "trials.jsonl").read_text().splitlines()]


def test_the_summary_says_not_distinguishable_first_and_the_ablation_agrees():
    recs = records()
    said = verdict_text(study_verdict(recs, 13, 0))
    assert said.startswith("The best configuration is not distinguishable from the strict "
                           f"fp32 baseline at this n: {INTERVAL}.")
    assert "80.22 samples/s median [73.7, 85.08], n=5" in said
    assert "75.52 samples/s median [69.26, 83.54], n=5" in said
    assert "windows of" in said and "noise threshold 2%" in said
    ablation = ablation_table(recs, 13)
    assert f"fused: {INTERVAL}: {SAME}" in ablation
    assert "without fused            75.52 [69.26, 83.54], n=5" in ablation
    # the ranked table gives each configuration its pooled figure and n
    rows = table(recs, multi=False).splitlines()
    assert "80.22" in rows[1] and rows[1].split()[4] == "5"


def test_the_report_and_its_ablation_agree():
    run = load_run(FIXTURE)
    h = headline(run)
    assert h.verdict.startswith("The best configuration is not distinguishable from the "
                                "strict fp32 baseline at this n")
    (fused,) = technique_effects(run).items
    assert fused.speedup == h.speedup and (fused.speedup_lo, fused.speedup_hi) == (
        h.study.versus_baseline.lo, h.study.versus_baseline.hi)
    assert fused.clear is False and fused.verdict.endswith(SAME)
    page = build_report(run)
    assert INTERVAL in page and "Mann-Whitney interval" in page
    assert "1.11" not in h.verdict  # the search's lone figure is no longer the headline


def test_compare_gives_the_ratio_of_two_studies_an_interval(tmp_path):
    other = tmp_path / "again"
    shutil.copytree(FIXTURE, other)
    page = build_compare([load_run(FIXTURE), load_run(other)])
    assert "1.00x (95% interval" in page and SAME in page
    assert "n=5" in page
    (line,) = ratio_lines([load_run(FIXTURE), load_run(other)])
    assert "best over quickstart" in line and line.endswith(SAME)


def _other_workload(tmp_path: Path, name: str | None = None, **args) -> Path:
    """The fixture's study, as if it had trained another model (its records' workload)."""
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    lines = []
    for line in (other / "trials.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["plan"]["workload"] = name or record["plan"]["workload"]
        record["plan"]["workload_args"] = {**record["plan"]["workload_args"], **args}
        lines.append(json.dumps(record))
    (other / "trials.jsonl").write_text("\n".join(lines) + "\n")
    return other


def test_compare_makes_no_ratio_between_runs_that_train_different_things(tmp_path):
    """A tiny GPT against an hf:llama study: no 'best over', no table of the same
    configurations' samples/s; tokens/s per device and MFU instead, and why."""
    other = _other_workload(tmp_path, name="hf:llama", hidden_size=128)
    runs = [load_run(FIXTURE), load_run(other)]
    first, *rest = ratio_lines(runs)
    assert first.startswith("these runs train different things (") and "no ratio" in first
    assert "trains hf:llama, quickstart" in first and first.count(" gpt") == 1
    assert len(rest) == 2 and all("tokens/s per device" in line and "MFU" in line
                                  for line in rest)
    assert not any("best over" in line for line in rest)
    page = build_compare(runs)
    assert "These runs train different things" in page and "not comparable" in page
    assert "the same configuration&#x27;s samples/s do not compare" in page or \
        "the same configuration's samples/s do not compare" in page
    assert "1.00x (95% interval" not in page


def test_compare_of_the_same_model_at_another_length_says_which_argument_differs(tmp_path):
    other = _other_workload(tmp_path, seq_len=1024)
    (first, *_rest) = ratio_lines([load_run(FIXTURE), load_run(other)])
    assert "'s gpt differs in seq_len (1024 against 64)" in first


def test_an_interval_with_no_end_or_past_the_chart_is_drawn_clipped_and_said():
    """A pair of single trials gives a one-sided interval (the issue's chart drew one out
    to +5,000%): drawn to the chart's edge, and its caption says so."""
    from training_harness.reports.compare import CLIP_HI, effects_side_by_side
    from training_harness.reports.effects import Effect, Effects

    wide = Effects("pairs", "", [Effect("fused", "pairs", speedup=1.2, speedup_lo=0.9,
                                        speedup_hi=51.0),
                                 Effect("amp", "pairs", speedup=1.5, speedup_lo=1.1,
                                        speedup_hi=None)])
    fig = effects_side_by_side(["a"], [wide])
    bars = fig.fig.data[0]
    assert max(u + c for u, c in zip(bars.error_x.array, bars.x, strict=True)) <= (
        (CLIP_HI - 1) * 100 + 1e-9)
    assert "drawn clipped" in fig.caption
    tight = Effects("pairs", "", [Effect("fused", "pairs", speedup=1.2, speedup_lo=1.1,
                                         speedup_hi=1.3)])
    assert "clipped" not in effects_side_by_side(["a"], [tight]).caption


def test_a_configuration_measured_once_never_stands_above_the_best_named_from_repeats():
    """The 5-minute run's fault: a lucky single figure (trial 9, 260 samples/s once) ranked
    first above the best named from 19 measurements. Now the best named leads the table,
    and the single figure is listed apart, with its n."""
    import copy

    recs = records()
    best = next(r for r in recs if str(r["trial_id"]) == "13")
    lucky = copy.deepcopy(best)
    lucky.update(trial_id=99, tags={**lucky["tags"], "phase": "search"})
    lucky["plan"]["micro_batch_size"] = 4  # another configuration
    lucky["metrics"]["samples_per_s"] = 10 * (best["metrics"]["samples_per_s"] or 1)
    rows = table([*recs, lucky], multi=False, best_id=13).splitlines()
    assert rows[1].split()[1] == "13"  # the best named, first
    apart = next(i for i, line in enumerate(rows) if line.startswith("  measured once"))
    lucky_row = next(i for i, line in enumerate(rows) if line.split()[1:2] == ["99"])
    assert lucky_row > apart and rows[lucky_row].split()[4] == "1"  # its n
