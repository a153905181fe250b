"""Reports opened in headless Chromium as a user would: no console error, no network
request, every figure drawn, record text shown as text. Needs Debian's `chromium`
(installed by .ci/run); skipped with a reason where it is absent."""

from __future__ import annotations

import json

import pytest

from tests.reports.chromium import BINARY, Chromium
from tests.reports.runs import synthetic_records, write_run
from tests.reports.test_report import HOSTILE, hostile_run
from training_harness.reports.compare import build_compare
from training_harness.reports.load import load_run
from training_harness.reports.report import build_report

pytestmark = pytest.mark.skipif(
    BINARY is None, reason="chromium is not installed (.ci/run installs Debian's chromium)")

SVG_HAS = ("[...document.querySelectorAll('.main-svg text')]"
           ".some(t => t.textContent.includes({!r}))")


@pytest.fixture(scope="module")
def browser():
    with Chromium() as b:
        yield b


@pytest.fixture(scope="module")
def real(quickstart_study):
    """A real study's folder: the README's quickstart, run once for the session."""
    assert quickstart_study.proc.returncode == 0, quickstart_study.proc.stderr
    return quickstart_study.out


def _open(browser, page: str, path):
    path.write_text(page, encoding="utf-8")
    seen = browser.visit(path)
    assert seen.console_errors == [] and seen.exceptions == []
    assert seen.requests == [], "the page must not touch the network"
    assert seen.plot_divs == page.count('class="plotly-graph-div"')
    assert seen.plots == seen.plot_divs, "every figure is drawn"
    assert not seen.injected
    return seen


# The figures of a study's page (reports.report.build_report), by the id of each one's
# section. Any study the tuner measured draws the first six. The other three depend
# on what the study reached in its time on this machine: leave-one-out trials of a best
# that uses a technique, two micro-batch sizes measured, two completed trials with a
# parameter that varied. Where one is not drawn, its section says why instead.
EVERY_STUDY = ("pareto", "history", "steps", "loss", "memory", "steptime")
IF_REACHED = ("effects", "mbs", "importances")
FIGURES = """(() => JSON.stringify(Object.fromEntries(%s.map(key => {
  const s = document.getElementById(key);
  const plot = s && s.querySelector('.plotly-graph-div');
  const empty = s && s.querySelector('p.empty');
  return [key, {section: !!s, drawn: !!(plot && plot.querySelector('.main-svg') &&
                                        plot._fullLayout),
                why: empty ? empty.innerText.trim() : ''}];
}))))()"""


@pytest.mark.slow
def test_real_quickstart_study_renders_offline(browser, real, tmp_path):
    """A real 20-second study on this machine: how many trials, and which figures they
    reach, depend on its speed (an AVX2 CPU runs bf16 about 30x slower than fp32), so
    the figures every study has are asserted, and for the others that the page says
    why each is absent."""
    run = load_run(real)
    assert len(run.trials) >= 2  # the baseline and one more, however busy the machine
    seen = _open(browser, build_report(run), tmp_path / "report.html")
    figures = json.loads(browser.evaluate(FIGURES % json.dumps(EVERY_STUDY + IF_REACHED)))
    for key in EVERY_STUDY:
        assert figures[key]["drawn"], (key, figures[key])
    for key in IF_REACHED:
        assert figures[key]["section"] and (figures[key]["drawn"] or figures[key]["why"]), (
            key, figures[key])
    assert seen.plots == sum(f["drawn"] for f in figures.values())  # and no other figure
    # The effects are drawn once a leave-one-out trial (a technique turned off) ran.
    t = run.trials
    if ((t["phase"] == "ablation") & t["ablation_without"].notna()).any():
        assert figures["effects"]["drawn"]
    assert "Headline" in seen.text and "What each technique bought" in seen.text
    shot = browser.visit(tmp_path / "report.html", screenshot=True).screenshot
    assert shot and shot.startswith(b"\x89PNG") and len(shot) > 50_000


@pytest.mark.slow
def test_compare_of_two_runs_renders_offline(browser, real, tmp_path):
    other = write_run(tmp_path / "cluster-b", synthetic_records(40, study="cluster-b"))
    seen = _open(browser, build_compare([load_run(real), load_run(other)]),
                 tmp_path / "compare.html")
    assert seen.plots == 3 and "quickstart" in seen.text and "cluster-b" in seen.text


def test_hostile_record_text_renders_as_text(browser, tmp_path):
    run = load_run(hostile_run(tmp_path))
    seen = _open(browser, build_report(run), tmp_path / "hostile.html")
    assert HOSTILE in seen.text                      # in the page's text, literally
    assert browser.evaluate(SVG_HAS.format("<script>"))  # and inside the figures
    assert browser.evaluate("document.querySelectorAll('img').length") == 0


def test_only_failed_and_single_trial_studies_render(browser, tmp_path):
    failed = synthetic_records(5, ablation=False)
    for r in failed:
        r.update(status="oom", reason="out of memory")
        r["metrics"]["samples_per_s"] = None
    seen = _open(browser, build_report(load_run(write_run(tmp_path / "f", failed))),
                 tmp_path / "failed.html")
    assert "No trial finished" in seen.text
    one = synthetic_records(1)[0]
    one.update(study=None, trial_id=None, tags={})
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "result.json").write_text(json.dumps(one))
    seen = _open(browser, build_report(load_run(tmp_path / "bench")), tmp_path / "one.html")
    assert "A study of one trial" in seen.text and seen.plots >= 1


def test_compare_of_two_synthetic_runs_renders_and_escapes(browser, tmp_path):
    a = load_run(write_run(tmp_path / "a", synthetic_records(40, study="cluster-a")))
    b = load_run(hostile_run(tmp_path))
    seen = _open(browser, build_compare([a, b]), tmp_path / "compare.html")
    assert seen.plots == 3 and "cluster-a" in seen.text and HOSTILE in seen.text


SORT = """(() => { const t = document.getElementById('trial-table');
  const col = [...t.tHead.rows[0].cells].findIndex(c => c.textContent === 'samples/s');
  t.tHead.rows[0].cells[col].click(); t.tHead.rows[0].cells[col].click();
  const v = [...t.tBodies[0].rows].map(r => parseFloat(r.cells[col].dataset.v));
  const box = document.querySelector('input.filter'); box.value = 'pruned';
  box.dispatchEvent(new Event('input'));
  const shown = [...t.tBodies[0].rows].filter(r => r.style.display !== 'none');
  return JSON.stringify({first: v[0], max: Math.max(...v.filter(x => !isNaN(x))),
                         last: v[v.length - 1], shown: shown.length}); })()"""


def test_trial_table_sorts_and_filters(browser, tmp_path):
    run = load_run(write_run(tmp_path / "s", synthetic_records(40)))
    assert _open(browser, build_report(run), tmp_path / "r.html").plots == 8  # effects too
    got = json.loads(browser.evaluate(SORT))
    assert got["first"] == pytest.approx(got["max"])   # descending after two clicks
    assert got["last"] is None   # trials without a figure go last (NaN, null in JSON)
    assert got["shown"] == (run.trials["status"] == "pruned").sum() > 0
