"""The trial table as CSV and JSON, and the `report` / `compare` commands."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.reports.runs import ROOT, synthetic_records, write_run
from training_harness.cli.main import main
from training_harness.reports.export import trial_table, write_csv, write_json
from training_harness.reports.load import load_run


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "s", synthetic_records(40))


def test_csv_and_json_hold_the_trial_table(run_dir, tmp_path):
    run = load_run(run_dir)
    table = trial_table(run)
    assert len(table) == len(run.trials)
    assert {"trial_id", "status", "reason", "config", "samples_per_s", "speedup_vs_baseline",
            "peak_memory_bytes", "memory_error_pct", "is_best", "command"} <= set(table.columns)
    csv = pd.read_csv(write_csv(run, tmp_path / "t.csv"), dtype={"trial_id": str})
    assert list(csv["trial_id"]) == list(run.trials.index)
    assert csv.loc[csv["is_baseline"], "speedup_vs_baseline"].iloc[0] == pytest.approx(1.0)
    assert csv["is_best"].sum() == 1
    rows = json.loads(write_json(run, tmp_path / "t.json").read_text())
    assert len(rows) == len(run.trials)
    pruned = next(r for r in rows if r["status"] == "pruned")
    assert pruned["samples_per_s"] is None and pruned["peak_memory_bytes"] is None
    assert isinstance(rows[0]["micro_batch_size"], int)


def test_report_command_writes_html_csv_and_json(run_dir, tmp_path, capsys):
    out = tmp_path / "out" / "r.html"
    assert main(["report", str(run_dir), "--out", str(out), "--csv", "--json"]) == 0
    assert all(out.with_suffix(s).is_file() for s in (".html", ".csv", ".json"))
    assert "wrote" in capsys.readouterr().out
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").is_file()


def test_compare_command_writes_one_page(run_dir, tmp_path):
    other = write_run(tmp_path / "b", synthetic_records(30, study="b", seed=2, thr_scale=0.5))
    out = tmp_path / "c.html"
    assert main(["compare", str(run_dir), str(other), "--out", str(out)]) == 0
    page = out.read_text()
    assert "Comparison: toy vs b" in page and page.count('class="plotly-graph-div"') == 3


def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "absent")]) == 2
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "harness report: error:" in err and "harness compare: error:" in err
    assert "Traceback" not in err


def test_report_never_imports_torch(run_dir):
    code = ("import sys; from training_harness.reports.report import build_report; "
            "from training_harness.reports.load import "
            f"load_run; build_report(load_run({str(run_dir)!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
