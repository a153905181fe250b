"""The GPU proof's plan (harness selftest --gpu --plan), its time boxes, the rehearsal's
flags, the page a stopped run leaves, and scripts/gpu-wheels' check (CPU only)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import tomli_w

from training_harness.cli.main import main
from training_harness.core.errors import HarnessError
from training_harness.selftest import proof
from training_harness.selftest.markdown import build

ROOT = Path(__file__).resolve().parents[1]


def selftest(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    # a cache of its own: the rehearsal measures a device profile, with which every plan
    # the machine prepares after it would be estimated (and its step traced)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HARNESS_CACHE_DIR": str(cwd / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "training_harness", "selftest", *args], cwd=cwd,
                          env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_plan_fits_9_minutes_in_the_issues_order_and_needs_no_gpu(tmp_path):
    done = selftest("--gpu", "--plan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    phases = [line.split()[0] for line in lines[1:]]
    assert phases == ["start", "tests", "bench", "tune", "report", "rest", "end", "total"]
    seconds = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    parts = sum(v for k, v in seconds.items() if k != "total")
    assert parts == seconds["total"] <= 540
    assert seconds["tune"] == 150 + proof.GPU.tune_overhead and seconds["rest"] == 0
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_time_limit_and_the_tune_budget_change_the_boxes():
    default = {b.phase: b.seconds for b in proof.boxes(list(proof.DEFAULT_PHASES), 525, 150,
                                                       proof.GPU)}
    assert default["tests"] == proof.GPU.tests and default["bench"] == proof.GPU.bench
    longer = {b.phase: b.seconds for b in proof.boxes(list(proof.DEFAULT_PHASES), 1200, 300,
                                                      proof.GPU)}
    # a longer run: the tune as asked, the core as before, the rest gets what is left
    assert longer["tune"] == 300 + proof.GPU.tune_overhead
    assert longer["tests"] == default["tests"] and longer["rest"] == pytest.approx(
        1200 - proof.GPU.start - proof.GPU.end - sum(v for k, v in longer.items() if k != "rest"))
    shorter = {b.phase: b.seconds for b in proof.boxes(list(proof.DEFAULT_PHASES), 420, 150,
                                                       proof.GPU)}
    assert shorter["tests"] < default["tests"] and shorter["bench"] < default["bench"]
    assert shorter["tests"] / shorter["bench"] == pytest.approx(
        default["tests"] / default["bench"], rel=1e-2)  # boxes are rounded to 0.1 s
    # without the rest, a longer limit fills the tests' and benches' boxes
    core = ["tests", "bench", "tune", "report"]
    filled = {b.phase: b.seconds for b in proof.boxes(core, 960, 150, proof.GPU)}
    assert filled["bench"] > default["bench"] and "rest" not in filled
    assert filled["report"] > default["report"]
    assert sum(filled.values()) == pytest.approx(960 - proof.GPU.start - proof.GPU.end,
                                                 abs=0.5)
    with pytest.raises(HarnessError, match=r"--time-limit 300s leaves .* raise it to"):
        proof.boxes(list(proof.DEFAULT_PHASES), 300, 150, proof.GPU)
    with pytest.raises(HarnessError, match="--tune-budget 30s"):
        proof.boxes(list(proof.DEFAULT_PHASES), 480, 30, proof.GPU)


def test_the_table_takes_what_the_phases_before_it_left():
    """The lent machine's one call (docs/gpu.md): the proof's phases, then the GPU table.
    On 2026-11-27 the phases ended 166 s early; the table's 60-s box alone would have
    wasted that. The rest keeps its box: a proof that ends early ends sooner."""
    phases = ["tests", "bench", "tune", "report", "table"]
    boxes = {b.phase: b.seconds for b in proof.boxes(phases, 585, 150, proof.GPU)}
    assert boxes["table"] == 60
    deadline = 1000.0 + 585  # the run started at 1000; the table starts 166 s early
    start = 1000.0 + proof.GPU.start + sum(boxes[p] for p in phases[:-1]) - 166
    end = proof.phase_end("table", start, boxes["table"], deadline, 0.0, proof.GPU.end)
    assert end == deadline - proof.GPU.end  # 60 + 166 s: its box and what was left
    # a phase with later ones keeps room for their boxes; the rest, its own box
    assert proof.phase_end("bench", 1000.0, 135, 1100.0, 40.0, 20) == 1060.0
    assert proof.phase_end("rest", start, 0.0, deadline, 0.0, proof.GPU.end) == start


def test_a_time_limit_too_short_is_refused_before_anything_runs(capsys):
    assert main(["selftest", "--gpu", "--time-limit", "4m", "--plan"]) == 2
    assert "raise it to" in capsys.readouterr().err


def test_the_proofs_plans_and_study_are_the_ones_the_issue_names():
    names = []
    for path in proof.CORE_PLANS:
        data = tomllib.loads((ROOT / path).read_text())
        names.append(data.get("name", Path(path).stem))
    assert names == ["gpt2-small-bf16", "gpt2-small-linear-ce", "gpt2-small-4096-bf16",
                     "gpt2-small-4096-sliding-window", "gpt2-small-sliding-window",
                     "gpt2-small-sdpa-cudnn", "gpt2-small-flex", "llama-1b-bf16",
                     "llama-1b-liger", "gpt2-small-float8-tensorwise",
                     "gpt2-small-float8-rowwise", "gpt2-small-cuda-graphs",
                     "checkpoint-selective", "quickstart", "amp-bf16", "fused", "checkpoint",
                     "gpt-medium"]
    plans = {n: tomllib.loads((ROOT / p).read_text()) for n, p in zip(names, proof.CORE_PLANS,
                                                                     strict=True)}
    good = plans["gpt2-small-bf16"]
    assert good["micro_batch_size"] == 64 and good["strategies"] == {
        "amp": {"dtype": "bf16"}, "fused": {"attention": "sdpa", "optimizer": "fused"}}
    assert good["workload"] == {"name": "gpt", "layers": 12, "heads": 12, "hidden": 768,
                                "seq_len": 1024, "vocab": 50304}
    fused = good["strategies"]["fused"]
    for name, change in (("gpt2-small-float8-tensorwise", {"float8": {"recipe": "tensorwise"}}),
                         ("gpt2-small-float8-rowwise", {"float8": {"recipe": "rowwise"}}),
                         ("gpt2-small-cuda-graphs", {"fused": {
                             **fused, "compile": True, "compile_mode": "reduce-overhead"}}),
                         ("gpt2-small-linear-ce", {"fused": {
                             **fused, "compile": False, "linear_cross_entropy": True}}),
                         ("gpt2-small-sdpa-cudnn", {"fused": {**fused, "sdpa_backend": "cudnn"}}),
                         ("gpt2-small-flex", {"fused": {**fused, "attention": "flex"}}),
                         ("gpt2-small-sliding-window", {"sparse_attention": {
                             "window_fraction": 0.25}})):
        plan = plans[name]  # one change of the known-good plan
        assert plan["strategies"] == {**good["strategies"], **change}, name
        assert {k: v for k, v in plan.items() if k not in ("strategies", "name")} == {
            k: v for k, v in good.items() if k not in ("strategies", "name")}
    # at 4096 the sliding window against full attention there; Liger against its Llama
    for name, reference, change in (
            ("gpt2-small-4096-sliding-window", "gpt2-small-4096-bf16",
             {"sparse_attention": {"window_fraction": 0.125}}),
            ("llama-1b-liger", "llama-1b-bf16", {"liger": {}})):
        plan, ref = plans[name], plans[reference]
        assert plan["strategies"] == {**ref["strategies"], **change}, name
        assert {k: v for k, v in plan.items() if k not in ("strategies", "name")} == {
            k: v for k, v in ref.items() if k not in ("strategies", "name")}
    assert plans["gpt2-small-4096-bf16"]["workload"]["seq_len"] == 4096
    assert plans["checkpoint-selective"]["strategies"]["checkpoint"]["policy"] == "selective"
    study = tomllib.loads((ROOT / proof.GPU_STUDY).read_text())
    assert study["known_good"]["micro_batch_size"] == 64
    assert "float8" in study["strategies"]
    assert study["strategies"]["fused"]["fixed"]["compile_mode"] == "reduce-overhead"


def test_the_rehearsal_makes_each_plan_tiny_and_runnable_on_a_cpu():
    flags = proof.rehearsal_flags(ROOT / "studies/selftest/plans/gpt2-small-float8-rowwise.toml")
    assert flags[:2] == ["--device", "cpu"] and "layers=1" in flags
    assert "float8:recipe=rowwise,emulate=true" in flags
    stand_in = ("fused:attention=sdpa,optimizer=fused,compile=false,compile_mode=default,"
                "sdpa_backend=auto")
    assert stand_in in flags
    graphs = proof.rehearsal_flags(ROOT / "studies/selftest/plans/gpt2-small-cuda-graphs.toml")
    assert stand_in in graphs
    resnet = proof.rehearsal_flags(ROOT / "studies/plans/resnet.toml")
    assert "--arg" not in resnet  # the GPT's sizes only for a GPT
    llama = proof.rehearsal_flags(ROOT / "studies/selftest/plans/llama-1b-bf16.toml")
    assert "num_hidden_layers=1" in llama and "layers=1" not in llama
    assert proof.cuda_only(ROOT / "studies/selftest/plans/llama-1b-liger.toml").startswith(
        "liger")
    assert proof.cuda_only(ROOT / "studies/selftest/plans/llama-1b-bf16.toml") is None


def test_the_gpu_tests_are_collected_from_their_files_only():
    files = proof.gpu_test_files(ROOT)
    assert "tests/test_gpu_paths.py" in files and "tests/test_cli.py" not in files
    args = proof.suite_args(proof.CORE_TESTS[0], ROOT, rehearse=False)
    # one process, on the GPU and in the rehearsal: no xdist workers sharing one device
    assert args[:4] == ["-n", "0", "-m", "gpu and not slow"] and args[4:] == files
    assert proof.suite_args(proof.CORE_TESTS[0], ROOT, rehearse=True) == args


def test_a_stopped_run_leaves_a_page_that_says_what_did_not_finish(tmp_path):
    state = {"device": {"name": "NVIDIA H100 80GB HBM3", "count": 1}, "phases": {
        "tests": {"runs": []},
        "bench": {"pattern": "the proof's 10 plans", "plans": [
            {"name": "quickstart", "dir": "bench/quickstart", "step": {"rc": None}}]},
        "tune": {"study": "s.toml", "dir": "tune"}},
        "runs": [{"command": "harness selftest --gpu", "started_at": "2026-11-26 09:00:00",
                  "wall_s": 200.0, "phases": list(proof.DEFAULT_PHASES),
                  "progress": {"tests": "done", "bench": "done", "tune": "stopped",
                               "report": "waiting", "rest": "waiting"},
                  "boxes": {"tests": 100, "bench": 135, "tune": 180, "report": 30}}]}
    page = build(tmp_path, state, "2026-11-26")
    assert ("Not finished when this page was written: tune (stopped midway), report (not "
            "started), rest (not started).") in page
    assert "not finished when this page was written" in page  # the tune's own line
    assert "| quickstart | no record |" in page


def _wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n"
                   f"Version: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


@pytest.mark.slow
def test_the_wheel_check_fails_when_a_wheel_is_missing_or_extra(tmp_path, capsys):
    """pip's resolver, for CPython 3.12 with no index, over wheels made here: torch is
    taken as present, a missing need fails it, so does a wheel nothing needs."""
    loader = importlib.machinery.SourceFileLoader("gpu_wheels", str(ROOT / "scripts/gpu-wheels"))
    spec = importlib.util.spec_from_loader("gpu_wheels", loader)
    wheels = importlib.util.module_from_spec(spec)
    loader.exec_module(wheels)
    _wheel(tmp_path, "training-harness", "0.1.0", ["torch>=2.6,<2.14", "alpha>=1"])
    assert wheels.check(tmp_path, extra=[]) == 1
    assert "No matching distribution found for alpha" in capsys.readouterr().out
    _wheel(tmp_path, "alpha", "1.0")
    assert wheels.check(tmp_path, extra=[]) == 0
    assert "gpu-wheels check: ok: 2 wheels" in capsys.readouterr().out
    _wheel(tmp_path, "beta", "2.0")
    assert wheels.check(tmp_path, extra=[]) == 1
    assert "beta-2.0-py3-none-any.whl: not needed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_rehearsals_bench_runs_every_proof_plan_tiny_on_the_cpu(tmp_path, monkeypatch):
    """`harness selftest --gpu --rehearse --only bench` with its default plans: each of the
    proof's plans, with the rehearsal's flags, benches ok on this CPU. Each step's
    `harness bench` runs in this process (the session's rank server runs its trial): a
    new interpreter and rank server per plan cost ten times what the plans' tiny steps
    do; the steps' subprocesses are the end-to-end rehearsal's below."""
    from training_harness.cli import selftest as cli_selftest
    from training_harness.selftest import phases as ph
    from training_harness.selftest.runner import Step

    ran: list[list[str]] = []

    calibrated: list[list[str]] = []

    def bench_here(run, argv, log, timeout_s):
        if argv[3] == "calibrate":  # the profile first (its own test is the estimator's)
            calibrated.append(argv)
            return Step(command=" ".join(argv), log=log.name, rc=0, seconds=0.0)
        assert calibrated, "the profile is measured before the plans"
        assert argv[1:4] == ["-m", "training_harness", "bench"]
        ran.append(argv)
        log.parent.mkdir(parents=True, exist_ok=True)
        rc = main(argv[3:])
        log.write_text(f"rc {rc}\n")
        return Step(command=" ".join(argv), log=log.name, rc=rc, seconds=0.0)

    monkeypatch.setenv("HARNESS_QUIET_SHARE", "1")  # as Run.step gives a rehearsal's steps
    monkeypatch.setattr(ph.Run, "step", bench_here)
    monkeypatch.setattr(cli_selftest, "_stop_on_sigterm", lambda: None)  # pytest's own
    out = tmp_path / "st"
    assert main(["selftest", "--gpu", "--rehearse", "--out", str(out), "--only", "bench",
                 "--time-limit", "10m"]) == 0
    state = json.loads((out / "selftest.json").read_text())
    plans = state["phases"]["bench"]["plans"]
    assert [p["name"] for p in plans] == [
        tomllib.loads((ROOT / p).read_text()).get("name", Path(p).stem)
        for p in proof.CORE_PLANS]
    rehearsed = [p for p in proof.CORE_PLANS if proof.cuda_only(ROOT / p) is None]
    assert [Path(argv[4]) for argv in ran] == [ROOT / p for p in rehearsed]
    assert [e["skipped"] for e in plans if "skipped" in e] == [
        "not rehearsed on the CPU (liger: Liger's kernels are Triton for CUDA GPUs)"]
    assert len(calibrated) == 1 and "--quick" in calibrated[0]
    for argv in ran:  # each tiny, as the rehearsal makes it
        assert argv[5:5 + len(proof.TINY_FLAGS)] == list(proof.TINY_FLAGS)
    for entry in plans:
        if "skipped" in entry:
            continue
        record = json.loads((out / entry["dir"] / "result.json").read_text())
        assert record["status"] == "ok", (entry["name"], record["reason"])
        assert record["plan"]["device"] == "cpu" and record["metrics"]["step_time_s"]["n"] == 2
    assert state["runs"][-1]["progress"] == {"bench": "done"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_rehearsal_runs_every_phase_on_the_cpu_and_writes_the_page(tmp_path):
    """harness selftest --gpu --rehearse end to end: the proof's plans (tiny, on the CPU),
    the tests' selections, a short tune and its report, the page after every step. The
    time limit is long (the boxes fill it) so that a busy machine cuts nothing. The tune:
    the rehearsal's own study with the least work a study does (the two references and one
    search trial, no final phases: --study), ended by its trial count on a quiet machine
    (about 20 s); its 90-s budget is the cap on a busy one (the tuner's start is on the
    study's clock: at load 12, 40 s left the first trial timed out). One ok trial and its
    report are what is checked. The bench: two of the proof's plans (--plans), the bf16
    reference and one it changes, for the page's comparison; that each of the proof's
    plans benches tiny on the CPU is proved by
    test_the_rehearsals_bench_runs_every_proof_plan_tiny_on_the_cpu above."""
    out = tmp_path / "st"
    two = tmp_path / "plans"
    two.mkdir()
    for name in ("gpt2-small-bf16", "gpt2-small-float8-rowwise"):
        (two / f"{name}.toml").write_text((ROOT / f"studies/selftest/plans/{name}.toml")
                                          .read_text())
    study = tomllib.loads((ROOT / proof.REHEARSAL_STUDY).read_text())
    study["budget"].update(n_trials=1, confirm_repeats=0, ablation_repeats=0)
    (tmp_path / "tune.toml").write_text(tomli_w.dumps(study))
    done = selftest("--gpu", "--rehearse", "--out", str(out), "--only", "tests,bench,tune,report",
                    "--time-limit", "14m", "--tune-budget", "90s", "--study",
                    str(tmp_path / "tune.toml"), "--plans", str(two / "*.toml"), cwd=tmp_path,
                    timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    state = json.loads((out / "selftest.json").read_text())
    assert state["rehearsal"] and state["device"]["name"] == "Rehearsal CPU"
    assert state["runs"][-1]["progress"] == {p: "done" for p in ("tests", "bench", "tune",
                                                                 "report")}
    plans = state["phases"]["bench"]["plans"]
    assert [p["name"] for p in plans] == ["gpt2-small-bf16", "gpt2-small-float8-rowwise"]
    assert all((out / p["dir"] / "result.json").is_file() for p in plans)
    assert state["phases"]["tune"]["report"]["step"]["rc"] == 0
    pages = list(out.glob("gpu_rehearsal-cpu_*.md"))
    assert len(pages) == 1
    page = pages[0].read_text()
    for text in ("# GPU selftest: Rehearsal CPU (on ", "**A rehearsal on the CPU**",
                 "## Tests", "## Bench", "## Tune", "| gpt2-small-float8-rowwise | ok |",
                 "Against `gpt2-small-bf16`", "Report: `tune-report.html` written",
                 "estimated with the device profile measured at the bench's start"):
        assert text in page, text
    assert json.loads((out / "profile.json").read_text())["quick"]  # measured first
    assert "Not finished" not in page
    assert not (tmp_path / "docs").exists()  # a rehearsal's page stays in its out folder


def test_the_rest_runs_what_the_benches_box_left_out_in_its_place(tmp_path):
    """A plan the bench's box cut is the first the rest runs; the page lists it once."""
    from training_harness.selftest import phases as ph
    from training_harness.selftest.runner import Step

    state = {"phases": {}, "runs": []}
    ran: list[str] = []

    def fake_step(argv, log, timeout_s):
        if "calibrate" in argv:
            return Step(command=" ".join(argv), log=log.name, rc=0, seconds=1.0)
        ran.append(Path(argv[argv.index("bench") + 1]).stem)
        folder = Path(argv[argv.index("--out") + 1])
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"status": "ok"}))
        return Step(command=" ".join(argv), log=log.name, rc=0, seconds=1.0)

    run = ph.Run(tmp_path, time.monotonic() + 3600, state, lambda: None, echo=False)
    run.step = fake_step
    core = [ROOT / p for p in proof.CORE_PLANS[:2]]
    run.phase_end = time.monotonic() - 1  # the bench's box is over before it starts
    ph.run_bench(run, core, 1, "the proof's plans")
    assert ran == [] and all(e["skipped"].startswith("out of time")
                             for e in state["phases"]["bench"]["plans"])
    run.phase_end = time.monotonic() + 3600
    rest = ph.rest_plans(ROOT, state)
    assert rest[:2] == core and (ROOT / "studies/plans/lamb.toml") in rest
    assert (ROOT / proof.CORE_PLANS[5]) not in rest  # a core plan is never run twice
    ph.run_bench(run, rest[:3], 1, "")
    names = [e["name"] for e in state["phases"]["bench"]["plans"]]
    assert ran == [p.stem for p in rest[:3]] and len(names) == len(set(names)) == 3
