"""`harness selftest --gpu`: its refusals, the plan-fits rule on the real plans, and the page
it writes from fabricated records (CPU only; nothing here runs a GPU step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training_harness.cli.main import main
from training_harness.selftest.device import Device, slug, visible_entries
from training_harness.selftest.figures import junit_counts, tune_figures
from training_harness.selftest.markdown import build
from training_harness.selftest.plans import plan_fit, ranks_per_node
from training_harness.selftest.runner import run_logged

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "studies" / "plans"


def selftest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # CUDA_VISIBLE_DEVICES="": no device here, also on a machine that has some
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "training_harness", "selftest", *args], cwd=cwd,
                          env=env,
                          capture_output=True, text=True, timeout=240)


def test_without_cuda_it_says_so_in_one_line_and_runs_nothing(tmp_path):
    done = selftest("--gpu", "--out", str(tmp_path / "st"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness selftest --gpu: no CUDA device here")
    assert lines[0].endswith("nothing was run")
    assert list(tmp_path.iterdir()) == []  # no out folder, no runs/, no docs/


def test_without_gpu_it_says_what_it_does_and_exits_2(capsys):
    assert main(["selftest"]) == 2
    err = capsys.readouterr().err
    assert "pass --gpu" in err and "harness bench" in err and "harness tune" in err
    assert main(["selftest", "--gpu", "--only", "tests,benches"]) == 2
    assert "--only 'tests,benches'" in capsys.readouterr().err
    assert main(["selftest", "--gpu", "--tune-budget", "soon"]) == 2
    assert "--tune-budget 'soon'" in capsys.readouterr().err


def test_which_plans_fit_one_gpu():
    fits = {p.stem: plan_fit(p, 1) for p in sorted(PLANS.glob("*.toml"))}
    assert fits["quickstart"].fits and fits["quickstart"].ranks_per_node == 1
    assert fits["single-device-all"].fits and fits["distributed-reference"].fits
    for name in ("ddp", "zero1", "zero3", "tensor", "pipeline-1f1b"):
        assert not fits[name].fits and fits[name].ranks_per_node == 2, name
    assert fits["ddp"].reason == "needs 2 GPUs per node ([layout] data = 2); 1 visible here"
    assert plan_fit(PLANS / "ddp.toml", 2).fits
    # several nodes: the ranks of one node
    assert ranks_per_node({"layout": {"data": 4, "tensor": 2, "nnodes": 2}}) == 4
    assert ranks_per_node({"nnodes": 2, "layout": {"pipeline": 2}}) == 1


def test_the_devices_cuda_visible_devices_leaves():
    assert visible_entries(None, 2) == [0, 1]
    assert visible_entries("", 2) == [] and visible_entries("-1", 2) == []
    assert visible_entries("1,0", 2) == [1, 0] and visible_entries("0,5,1", 2) == [0]
    assert visible_entries("GPU-abc", 1) == ["GPU-abc"]
    assert slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and slug(None) == "gpu"


@pytest.mark.timeout(120)
def test_a_step_is_logged_and_stopped_at_its_timeout(tmp_path):
    ok = run_logged([sys.executable, "-c", "print('hello')"], tmp_path / "a.log", 60,
                    root=tmp_path, echo=False)
    assert ok.ok and ok.log == "a.log" and "hello" in (tmp_path / "a.log").read_text()
    # a step that outlives the test's own timeout: stopped at its 1 s, or the test fails
    slow = run_logged([sys.executable, "-c", "import time; print('up', flush=True); "
                       "time.sleep(600)"], tmp_path / "b.log", 1, root=tmp_path, echo=False)
    assert slow.timed_out and not slow.ok
    assert "up" in (tmp_path / "b.log").read_text()


# --- the page, from fabricated records ---------------------------------------------

ENV = {"torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.04",
       "device_name": "NVIDIA H100 80GB HBM3", "packages": {"triton": "3.6.0"},
       "gpus": [{"index": 0}]}
PEAKS = {"dtype": "bf16", "datasheet": {"flops": 989.4e12, "source": "datasheet: H100 bf16"},
         "measured": {"flops": 667e12, "source": "measured: bf16 matmul"}, "used": "datasheet",
         "flops": 989.4e12, "source": "datasheet: H100 bf16", "reason": "datasheet"}


def record(samples: float, median: float, peak: int, predicted: int, predicted_step: float,
           status: str = "ok", reason: str | None = None, phase: str = "search",
           trial_id: int | str = 0, strategies: dict | None = None, **metrics) -> dict:
    tflops = 317.4 * samples / 362.4
    return {
        "schema": 1, "trial_id": trial_id, "status": status, "reason": reason, "env": ENV,
        "plan": {"layout": {"data": 1, "pipeline": 1, "tensor": 1}, "micro_batch_size": 64,
                 "strategies": strategies or {}},
        "predicted": {"peak_memory_bytes": predicted, "step_time_s": predicted_step},
        "metrics": {"samples_per_s": samples, "tflops_per_device": tflops,
                    "step_time_s": {"median": median, "p10": median * 0.99,
                                    "p90": median * 1.02, "n": 20},
                    "mfu": tflops * 1e12 / 989.4e12, "mfu_measured_peak": tflops * 1e12 / 667e12,
                    "peak_flops": PEAKS, "peak_memory_bytes": peak,
                    "memory": {"allocated": peak, "reserved": peak + 2**30}, **metrics}
        if status == "ok" else {},
        "tags": {"phase": phase},
    }


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.kernels.test_kernel_layernorm" name="test_grad[(4, 1)-torch.float32]">
<failure message="not close">AssertionError</failure></testcase>
<testcase classname="tests.test_gpu_paths.TestTwo" name="test_ddp"><skipped message="2 GPUs"/>
</testcase><testcase classname="tests.test_gpu_paths" name="test_one"/>
<testcase classname="tests.test_gpu_paths" name="test_two"/>
</testsuite></testsuites>"""


@pytest.fixture
def out(tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "selftest"
    (out / "tests").mkdir(parents=True)
    (out / "tests" / "gpu.xml").write_text(JUNIT)
    bench = {"quickstart": record(748.9, 0.0107, 1_331_000_000, 1_000_000_000, 0.0027,
                                  window={"seconds": 2.0, "steps": 180,
                                          "samples_per_s": 720.5, "source": "wall clock"},
                                  nvml={"utilization_mean_pct": 34.6}),
             "amp-fp16": record(0, 0, 0, 0, 0, status="oom", reason="CUDA out of memory")}
    for name, r in bench.items():
        (out / "bench" / name).mkdir(parents=True)
        (out / "bench" / name / "result.json").write_text(json.dumps(r))
    amp = {"amp": {"dtype": "bf16"}}
    trials = [
        record(0, 0, 0, 0, 0, status="pruned", reason="not launched: predicted peak memory "
               "110.62 GiB is over the memory budget", phase="baseline", trial_id=0),
        record(362.4, 0.1766, 100 * 2**30, 110 * 2**30, 0.1589, phase="known-good",
               trial_id=1, strategies=amp),  # memory +10%, step -10%
        record(120.8, 0.53, 50 * 2**30, 40 * 2**30, 0.583, trial_id=2),  # -20%, +10%
        record(362.4, 0.1766, 1, 1, 1.0, trial_id=3, strategies=amp),
    ]
    trials[3]["tags"]["duplicate_of"] = 1  # the first run's figures: counted once
    (out / "tune").mkdir()
    (out / "tune" / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials)
                                               + '{"cut short')
    (out / "tune" / "study.json").write_text(json.dumps(
        {"best_trial_id": 1, "stopped_because": "time", "peaks": {"bf16": PEAKS}}))
    state = {
        "device": Device(1, "NVIDIA H100 80GB HBM3", "580.159.04", 85 * 10**9).to_json(),
        "runs": [{"command": "harness selftest --gpu", "started_at": "2026-11-23 08:00:00",
                  "wall_s": 1452.0, "phases": ["tests", "bench", "tune"]}],
        "phases": {
            "tests": {"runs": [
                {"name": "gpu", "junit": "tests/gpu.xml",
                 "step": {"command": "python -m pytest -m gpu tests", "rc": 1,
                          "seconds": 96.0, "log": "tests/gpu.log", "timed_out": False}},
                {"name": "kernels", "skipped": "only 12 s left within the time limit"}]},
            "bench": {"pattern": "studies/plans/*.toml", "gpus": 1, "plans": [
                {"name": "amp-fp16", "dir": "bench/amp-fp16", "step": {"rc": 0}},
                {"name": "ddp", "skipped": "needs 2 GPUs per node ([layout] data = 2); "
                                           "1 visible here"},
                {"name": "quickstart", "dir": "bench/quickstart", "step": {"rc": 0}},
                {"name": "vit", "skipped": "out of time: 10 s left for benches"}]},
            "tune": {"dir": "tune", "budget_s": 900, "step": {
                "command": "/venv/bin/python3 -m training_harness tune "
                           "studies/gpt2-small-1gpu.toml",
                "rc": 0, "seconds": 921.0, "log": "tune.log"}},
        }}
    return out, state


def test_junit_counts_and_failing_ids(out):
    counts = junit_counts(out[0] / "tests" / "gpu.xml")
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped", "total")} == {
        "passed": 2, "failed": 1, "errors": 0, "skipped": 1, "total": 4}
    assert counts["failing"] == [
        "tests/kernels/test_kernel_layernorm.py::test_grad[(4, 1)-torch.float32]"]
    assert junit_counts(out[0] / "missing.xml") is None


def test_tune_figures(out):
    folder = out[0] / "tune"
    trials = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()[:4]]
    t = tune_figures(trials, json.loads((folder / "study.json").read_text()))
    assert t["by_status"] == {"ok": 3, "pruned": 1}
    assert t["best"]["trial_id"] == 1 and t["baseline"]["samples_per_s"] is None
    assert t["ratio"] is None  # the baseline did not run ok
    assert t["memory_error"] == pytest.approx(0.15) and t["memory_n"] == 2  # |+10%|, |-20%|
    assert t["step_error"] == pytest.approx(0.10, abs=1e-3) and t["step_n"] == 2
    assert t["model_error"] is None and t["model_n"] == 0  # no trial had a correction
    trials[2]["predicted"].update(corrected_step_time_s=0.53 * 1.05, corrected_from_trials=1)
    t = tune_figures(trials, {})
    assert t["model_error"] == pytest.approx(0.05) and t["model_n"] == 1
    trials[0] = record(120.8, 0.53, 1, 1, 1.0, phase="baseline")
    assert tune_figures(trials, {})["ratio"] == pytest.approx(3.0)
    # a trial that ran but held more than the budget is named (it is never the best)
    over = tune_figures(trials, {"memory_budget_bytes": 80 * 2**30})["over_budget"]
    assert [o["trial_id"] for o in over] == [1]


def test_the_page_holds_the_figures(out):
    folder, state = out
    page = build(folder, state, "2026-11-23")
    assert page.startswith("# GPU selftest: NVIDIA H100 80GB HBM3, 2026-11-23")
    for text in ("| driver | 580.159.04 |", "| torch | 2.11.0+cu130 |", "| CUDA | 13.0 |",
                 "| Triton | 3.6.0 |", "`harness selftest --gpu`", "24.2 min"):
        assert text in page, text
    # tests: counts, the failing id, the suite that did not run
    assert '| `pytest -m "gpu and not slow"` | 2 | 1 | 0 | 1 | 96 s | 1 |' in page
    assert "- `tests/kernels/test_kernel_layernorm.py::test_grad[(4, 1)-torch.float32]`" in page
    assert "did not run: only 12 s left" in page
    # bench: rate, spread, window, MFU both ways, memory against prediction
    assert ("| quickstart | ok | 748.9 | 10.70 [10.59, 10.91] (n=20) | 3.0% | 35% | 720.5 "
            "over 180 steps, 2.00 s |") in page
    # a GPU that ran kernels a third of the window: the plan's speed is the host's too
    assert "Host-bound (the GPU ran kernels under 80% of the window, NVML): quickstart (35%)" \
        in page
    assert "| 66.3% | 98.3% of 667 TFLOP/s |" in page  # 655.9 TFLOP/s over 989.4 and 667
    assert "| quickstart | 1.24 GiB (1.24 GiB / 2.24 GiB) | 953.67 MiB | -24.9% " in page
    assert "| 10.70 | 2.70 | -74.8% |" in page
    assert "- amp-fp16: oom: CUDA out of memory" in page
    assert "- ddp: needs 2 GPUs per node ([layout] data = 2); 1 visible here" in page
    assert "- vit: out of time: 10 s left for benches" in page
    # tune: the best, the baseline's reason, the estimator's error, the study's peaks
    assert "| best | trial 1 (known-good): 362.4 samples/s" in page
    assert "`d1p1t1, micro-batch 64: amp(dtype=bf16)`" in page
    assert "| fp32 baseline | did not run ok: pruned: not launched: predicted peak memory " \
           "110.62 GiB" in page
    assert "| tuned over fp32 baseline | - |" in page
    assert "| estimator error, peak memory | 15.0% median" in page
    assert "| estimator error, step time | 10.0% over 2 |" in page
    assert "| bf16 | 989 TFLOP/s (datasheet: H100 bf16) | 667 TFLOP/s" in page
    assert "`python -m training_harness tune studies/gpt2-small-1gpu.toml`: exit code 0" in page
    assert "Not run" not in page


def test_a_host_bound_gpu_record_says_so_in_the_bench_table():
    """NVML's utilisation over the window: under 80% the record is called host-bound
    (on an H200 the tiny plans ran kernels 12-46% of their steps and moved by up to 45%
    between two machines; GPT-2 small at micro-batch 64 ran them 96-100%)."""
    from training_harness.cli.bench_table import result_table

    def bench(samples, median, util):
        return record(samples, median, 2**30, 2**30, median / 2, tokens_per_s=None,
                      peak_flops_source="datasheet", loss={"first": None},
                      nvml={"utilization_mean_pct": util})

    bound, busy, cpu = bench(748.9, 0.0107, 34.6), bench(406.1, 0.1576, 99.9), bench(40, 0.2, None)
    assert "GPU busy            35% of the window (NVML); HOST-BOUND: the host's kernel " \
        "launches bound the step" in result_table(bound)
    assert "GPU busy            100% of the window (NVML)\n" in result_table(busy)
    assert "GPU busy" not in result_table(cpu)


def test_the_page_says_which_phases_did_not_run(out):
    folder, state = out
    del state["phases"]["tune"]
    state["runs"][0]["phases"] = ["tests", "bench"]
    page = build(folder, state, "2026-11-23")
    assert "Not run: tune (run `harness selftest --gpu --only tune" in page
    assert "## Tune" not in page and "## Bench" in page
    base = record(120.8, 0.53, 1, 1, 1.0, phase="baseline")
    trials = [base, record(362.4, 0.1766, 2, 2, 0.2, trial_id=1)]
    (folder / "tune" / "trials.jsonl").write_text("\n".join(json.dumps(t) for t in trials))
    state["phases"]["tune"] = {"dir": "tune", "budget_s": 900, "step": {"rc": 0}}
    assert "| tuned over fp32 baseline | **3.00x** |" in build(folder, state, "2026-11-23")


def test_the_table_phase_resumes_the_table_and_the_page_says_what_it_added(tmp_path):
    """--only table runs the table study as `harness tune` into its folder, with --resume
    once the folder holds it (several GPU sessions add to one table), and the page says
    how many configurations are measured (a record skipped for time is not); the study is the GPU
    subspace of issue 24."""
    import time

    from training_harness.selftest import phases as ph
    from training_harness.selftest.runner import Step

    study = ROOT / "studies" / "gpt2-small-1gpu-table.toml"
    folder = tmp_path / "table"
    asked: list[list[str]] = []

    def fake_step(argv, log, timeout_s):
        asked.append(argv)
        folder.mkdir(exist_ok=True)
        (folder / "study.json").write_text("{}")
        with open(folder / "trials.jsonl", "a") as f:
            f.write(json.dumps({"status": "ok"}) + "\n")
            f.write(json.dumps({"status": "pruned", "tags": {"pruned": "time"}}) + "\n")
        return Step(command=" ".join(argv), log=log.name, rc=0, seconds=1.0, timed_out=False)

    state = {"phases": {}, "runs": []}
    run = ph.Run(tmp_path, time.monotonic() + 3600, state, lambda: None, echo=False)
    run.step = fake_step
    assert ph.run_table(run, study, folder) and ph.run_table(run, study, folder)
    assert "--resume" not in asked[0] and "--resume" in asked[1]
    assert asked[0][asked[0].index("--out") + 1] == str(folder)
    assert state["phases"]["table"]["after"] == 2 and state["phases"]["table"]["before"] == 1
    state["device"] = {"name": "NVIDIA H100 80GB HBM3"}
    page = build(tmp_path, state, "2026-11-24")
    assert ("2 configurations measured (2 ok), 1 of them this session; 4 records" in page)
    table = __import__("tomllib").loads(study.read_text())
    assert table["sampler"] == "grid" and table["pruning"]["slower_than"] == 0
    # its folder is named by the study, and the table can be finished: a few GPU
    # sessions' 4-5 minutes of table each, not the 3 hours the first (378) needed
    from tests.benchmarks.surface_replay.world import h100_world
    from training_harness.cli.selftest import TABLE_STUDY, table_folder
    from training_harness.study.search_space import SearchSpace
    from training_harness.study.study_file import Study

    assert table_folder(ROOT / TABLE_STUDY, "NVIDIA H200") == (
        ROOT / "tests" / "benchmarks" / "tables" / f"{table['name']}_h200")
    with h100_world(1):
        assert len(SearchSpace.of(Study.from_toml(study), "cuda").enumerate()) <= 100


def test_the_page_lists_the_versions_the_run_saw(out, capsys):
    """The selftest's own process records every declared dependency, installed or not,
    against its tested range, prints them in one line, and the page has their table."""
    from training_harness.cli.selftest import _versions

    folder, state = out
    state["versions"] = _versions()
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("versions: torch ") and "\n" not in printed
    assert "all within the ranges the harness is tested with" in printed
    page = build(folder, state, "2026-11-23")
    assert "## Versions" in page and "| package | installed | tested range | extra |" in page
    versions = page[page.index("## Versions"):].splitlines()
    torch_row = next(line for line in versions if line.startswith("| torch |"))
    assert ">=2.6" in torch_row and torch_row.endswith("| core |")
    assert any(line.startswith("| transformers |") and "| hf |" in line for line in versions)
