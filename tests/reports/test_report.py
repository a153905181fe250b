"""The page: an honest headline, every section, plain statements where data is missing,
and record text that can never become markup or script."""

from __future__ import annotations

import re

import pytest

from tests.reports.runs import synthetic_records, write_run
from training_harness.reports.headline import headline
from training_harness.reports.load import load_run
from training_harness.reports.report import build_report
from training_harness.reports.style import esc

HOSTILE = "<script>window.__injected=true</script>"
IMG = '<img src=x onerror="window.__injected=true">'


def hostile_run(tmp_path):
    """A study whose name, reasons, workload arguments, strategy and phase hold markup."""
    recs = synthetic_records(30, study=HOSTILE)
    recs[2].update(status="failed", reason=f"{IMG} then {HOSTILE}\n  File {HOSTILE}")
    recs[2]["metrics"]["traceback_tail"] = HOSTILE
    for r in recs:
        r["plan"]["workload"]["note"] = HOSTILE
    recs[3]["plan"]["strategies"][HOSTILE] = {"k": IMG}
    recs[4]["tags"]["phase"] = HOSTILE
    recs[4]["status"] = HOSTILE  # an unknown status is shown, not trusted
    return write_run(tmp_path / "hostile", recs, name=HOSTILE, stopped_because=IMG)


def _scripts(page: str) -> list[str]:
    return re.findall(r"<script[^>]*>", page, flags=re.I)


def test_record_text_is_escaped_everywhere(tmp_path):
    run = load_run(hostile_run(tmp_path))
    page = build_report(run)
    assert HOSTILE not in page and IMG not in page
    assert "<img" not in page.lower()
    assert "&lt;script&gt;window.__injected=true&lt;/script&gt;" in page  # shown as text
    # the only script elements are the page's own: config, plotly.js, one per figure, sorting
    figures = page.count('class="plotly-graph-div"')
    assert len(_scripts(page)) == 3 + figures
    # inside figure JSON, '<' never appears raw: no "</script>" can close the element early
    for body in re.findall(r"Plotly\.newPlot\((.*?)\)\s*};\s*</script>", page, flags=re.S):
        assert "<" not in body


def test_figure_text_is_entity_escaped():
    assert esc(HOSTILE) == "&lt;script&gt;window.__injected=true&lt;/script&gt;"
    assert esc("x" * 10, limit=5) == "xxxx…"


def test_headline_is_best_over_baseline_of_the_same_study(tmp_path):
    run = load_run(write_run(tmp_path / "s", synthetic_records(40)))
    h = headline(run)
    best, base = run.trials.loc[run.best_id], run.trials.loc[run.baseline_id]
    # every measurement of each configuration pooled: the Hodges-Lehmann ratio lies among
    # the ratios of the best's measurements to the baseline's, the search's among them
    v = h.study
    assert h.speedup == pytest.approx(v.versus_baseline.estimate)
    assert best["samples_per_s"] in v.best.values and base["samples_per_s"] in v.baseline.values
    ratios = sorted(a / b for a in v.best.values for b in v.baseline.values)
    assert ratios[0] <= h.speedup <= ratios[-1]
    assert h.memory_ratio == pytest.approx(best["peak_memory_bytes"] / base["peak_memory_bytes"])
    page = build_report(run)
    assert f"{h.speedup:.2f}×" in page and "Reproduce the best configuration" in page
    assert "harness bench" in page and "best.toml" in page
    for key in ("headline", "effects", "pareto", "mbs", "history", "importances", "steps", "loss",
                "memory", "trials", "failures", "study", "env"):
        assert f'<section id="{key}">' in page, key
    assert page.count('class="plotly-graph-div"') == 8
    assert "From optuna.journal" in page


def test_failed_baseline_gives_no_speedup_and_says_so(tmp_path):
    recs = synthetic_records(10, ablation=False)
    recs[0].update(status="oom", reason="out of memory: CUDA out of memory")
    run = load_run(write_run(tmp_path / "s", recs))
    h = headline(run)
    assert h.speedup is None
    assert "did not finish (oom: out of memory" in " ".join(h.missing)
    assert "no speedup is given" in build_report(run)


def test_missing_baseline_gives_no_speedup_and_says_so(tmp_path):
    recs = [r for r in synthetic_records(10, ablation=False) if r["trial_id"] != 0]
    run = load_run(write_run(tmp_path / "s", recs, journal=False))
    assert run.baseline_id is None and headline(run).speedup is None
    assert "There is no fp32 baseline trial" in build_report(run)


def test_only_failed_or_pruned_trials_report_plainly(tmp_path):
    recs = synthetic_records(6, ablation=False)
    for r, status in zip(recs, ["oom", "pruned", "failed", "pruned", "timeout", "oom"],
                         strict=True):
        r.update(status=status, reason=f"{status} on purpose")
        r["metrics"]["samples_per_s"] = None
    run = load_run(write_run(tmp_path / "s", recs))
    page = build_report(run)
    assert "No trial finished: all 6 trial(s) are failed or pruned" in page
    assert "2 oom" in page and "2 pruned" in page
    assert "Importances need at least two completed trials" in page
    assert "Failures, grouped by reason" in page


def test_a_single_trial_reports_plainly(tmp_path):
    run = load_run(write_run(tmp_path / "s", synthetic_records(1), journal=False))
    page = build_report(run)
    assert "A study of one trial: there is nothing to compare it with." in page
    assert "The best configuration is the fp32 baseline itself" in page
    assert "there is no history" in page and "Every trial finished." in page


def test_rdb_storage_is_not_contacted(tmp_path):
    run_dir = write_run(tmp_path / "s", synthetic_records(30), journal=False,
                        storage="postgresql://***@db.example/optuna")
    page = build_report(load_run(run_dir))
    assert "which the report does not contact" in page and "Rebuilt from the records" in page


def test_a_damaged_journal_falls_back_to_the_records(tmp_path):
    run_dir = write_run(tmp_path / "s", synthetic_records(30))
    (run_dir / "optuna.journal").write_text("not a journal\n")
    page = build_report(load_run(run_dir))
    assert "Rebuilt from the records" in page
    assert page.count('class="plotly-graph-div"') == 8  # importances still drawn


@pytest.mark.parametrize("within", [False, True])
def test_the_headline_pools_the_confirmation_rounds(tmp_path, within):
    import copy

    recs = [r for r in synthetic_records(8, ablation=False) if r["status"] == "ok"][:2]
    recs[0]["tags"]["phase"] = "baseline"
    base, best = recs
    base["metrics"]["samples_per_s"], best["metrics"]["samples_per_s"] = 200.0, 300.0
    again = {False: ([190, 210, 205, 195], [290, 310, 305, 295]),  # apart: faster
             True: ([190, 310, 205, 195], [290, 210, 305, 310])}[within]  # overlapping
    for rnd, (b, a) in enumerate(zip(*again, strict=True)):
        for r, rate in ((best, a), (base, b)):
            c = copy.deepcopy(r)
            c["trial_id"] = f"confirm-{r['trial_id']}-{rnd}"
            c["tags"] = {"phase": "confirm", "confirm": {"of": str(r["trial_id"]), "round": rnd}}
            c["metrics"]["samples_per_s"] = float(rate)
            recs.append(c)
    run = load_run(write_run(tmp_path / "run", recs, best_trial_id=best["trial_id"],
                             baseline_trial_id=base["trial_id"]))
    h = headline(run)
    assert h.study.best.n == h.study.baseline.n == 5  # the search's and 4 rounds' each
    assert h.study.best.median == 300.0 and h.study.baseline.median == 200.0
    assert "5 and 5 measurements" in h.basis
    assert h.verdict.startswith("The best configuration is not distinguishable") == within
    assert h.study.verdict == ("not distinguishable at this n" if within else "faster")


def test_a_host_bound_gpu_trial_is_marked_and_its_gpu_busy_share_exported(tmp_path):
    """NVML's utilisation over the window (metrics.nvml.utilization_mean_pct): a trial
    whose GPU ran kernels under 80% of it is marked host-bound in the trial table (the
    host's launches set its speed); the share is a column of the CSV."""
    from training_harness.reports.export import trial_table

    recs = synthetic_records(5)
    recs[1]["metrics"]["nvml"] = {"utilization_mean_pct": 34.6}
    recs[2]["metrics"]["nvml"] = {"utilization_mean_pct": 99.0}
    run = load_run(write_run(tmp_path / "h", recs, journal=False))
    page = build_report(run)
    assert page.count(">host-bound</i>") == 1
    assert 'title="the GPU ran kernels 35% of the window: the host&#x27;s kernel launches' in page
    table = trial_table(run)
    assert table["gpu_busy_pct"].dropna().tolist() == [34.6, 99.0]
    assert table["host_bound"].astype(bool).sum() == 1
