"""The command line as a user meets it: records written, mistakes refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training_harness.cli.main import main
from training_harness.records.result import empty_metrics

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "studies" / "plans"
TINY = ["--arg", "layers=2", "--arg", "hidden=32", "--arg", "heads=2",
        "--arg", "seq_len=16", "--arg", "vocab=64", "--steps", "2", "--warmup-steps", "1"]

SCHEMA_KEYS = {"schema", "study", "trial_id", "status", "reason", "plan", "predicted",
               "metrics", "env", "command", "started_at", "duration_s"}


def harness(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training_harness", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def assert_schema_v1(record: dict) -> None:
    assert record.keys() >= SCHEMA_KEYS
    assert record["schema"] == 1
    required = empty_metrics()
    for key, value in required.items():
        assert key in record["metrics"], key
        if isinstance(value, dict):
            assert value.keys() <= record["metrics"][key].keys(), key
    assert {"peak_memory_bytes", "step_time_s"} <= record["predicted"].keys()


@pytest.mark.slow
def test_bench_quickstart_writes_a_complete_record(tmp_path, capsys):
    """The README's plan at its own sizes, as a user runs it (its own process). Four
    measured steps after one warm-up, not the file's 10 after 3: a complete record and a
    falling loss need no more, and the flags' override is what test_bench_from_flags_only
    checks too."""
    out = tmp_path / "quick"
    proc = harness("bench", str(PLANS / "quickstart.toml"), "--steps", "4", "--warmup-steps",
                   "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "result.json").read_text())
    assert_schema_v1(record)
    assert record["status"] == "ok", record["reason"]
    assert record["plan"]["workload"]["layers"] == 4 and record["plan"]["micro_batch_size"] == 8
    m = record["metrics"]
    assert m["step_time_s"]["n"] == 4
    assert m["step_time_s"]["p10"] <= m["step_time_s"]["median"] <= m["step_time_s"]["p90"]
    assert m["samples_per_s"] > 0 and m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 256)
    assert 0 < m["mfu"] < 1.5 and m["peak_flops_source"]
    assert m["peak_memory_bytes"] > 0 and m["memory"]["rss"] > 0
    assert m["loss"]["finite"] and m["loss"]["last"] < m["loss"]["first"]
    assert record["env"]["torch"]
    assert "status" in proc.stdout and "MFU" in proc.stdout
    # The stored plan re-runs: `harness estimate` takes it (in this process: the command's
    # own process is the bench's above).
    capsys.readouterr()
    assert main(["estimate", str(out / "plan.toml"), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)


def test_bench_from_flags_only(tmp_path, capsys):
    # in this process (the session's rank server runs the trial): the command's own
    # process is test_bench_says_where_its_time_went_and_imports_no_torch's
    out = tmp_path / "flags"
    code = main(["bench", "--workload", "gpt", *TINY, "--strategy", "amp:dtype=bf16",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "result.json").read_text())
    assert record["status"] == "ok"
    assert record["plan"]["strategies"] == {"amp": {"dtype": "bf16", "init_scale": 65536.0}}
    assert record["plan"]["workload"]["layers"] == 2


BENCH_PHASES = {"python", "cli", "plan", "check", "peaks", "flops", "estimate", "env",
                "helper", "launch", "start", "setup", "warmup", "finish"}


# As `python -m training_harness` runs it, and then says whether torch was imported: an exit
# hook prints that after main() returned (the command's own exit does not unload it).
BENCH_AS_A_USER = """import atexit, runpy, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules))
sys.argv = ["harness", *sys.argv[1:]]
runpy.run_module("training_harness", run_name="__main__", alter_sys=True)
"""


def test_bench_says_where_its_time_went_and_imports_no_torch(tmp_path):
    """--verbose prints the command's phases and the record keeps them (metrics.phases_s):
    one after the other, so with the measured window they add up to no more than the
    wall clock (the interpreter's exit comes after the record). The plan is prepared by
    the torch-side helper, a fork of the rank server, its ranks' parent: torch is imported
    once, there, never in the command's process. (One command for both: each costs a
    rank server.)"""
    from training_harness.launch import rank_server

    if not rank_server.enabled():
        pytest.skip("no forkserver here: the plan is prepared in the command's process")
    out = tmp_path / "phases"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", BENCH_AS_A_USER, "bench", "--workload", "gpt",
                           *TINY, "--out", str(out), "--verbose"], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "torch imported: False"
    m = json.loads((out / "result.json").read_text())["metrics"]
    phases = m["phases_s"]
    assert set(phases) == BENCH_PHASES
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) + m["window"]["seconds"] <= wall
    assert "where the time went" in proc.stdout and "helper" in proc.stdout
    assert "(measured steps)" in proc.stdout


def _bench_in_python(code: str, out: Path, env: dict[str, str] | None = None) -> list[str]:
    argv = ["bench", "--workload", "gpt", *TINY, "--out", str(out)]
    script = (f"import sys\nfrom training_harness.cli.main import main\n"
              f"rc = main({argv!r})\n{code}")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


# The bench process imports no torch (with the rank server): proven by
# test_bench_says_where_its_time_went_and_imports_no_torch, in the same command.


@pytest.mark.slow  # the helper, then the rank, each a new interpreter importing torch
def test_bench_without_the_rank_server_prepares_in_a_helper_of_its_own(tmp_path):
    """HARNESS_FORK_RANKS=0: the helper and the rank are fresh interpreters; the command's
    process still imports no torch."""
    env = {**os.environ, "HARNESS_FORK_RANKS": "0"}
    last = _bench_in_python("print(rc, 'torch' in sys.modules)", tmp_path / "o", env)[-1]
    assert last == "0 False"
    phases = json.loads((tmp_path / "o" / "result.json").read_text())["metrics"]["phases_s"]
    assert {"check", "peaks", "flops", "estimate", "env", "helper", "launch", "start",
            "warmup"} <= set(phases)
    assert "python" not in phases  # main() was given argv


def test_user_workload_from_a_module_path(tmp_path, capsys):
    out = tmp_path / "user"
    code = main(["bench", "--workload", "tests.user_workload:build", "--arg", "width=8",
                 "--steps", "2", "--warmup-steps", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "result.json").read_text())
    assert record["status"] == "ok"
    assert record["metrics"]["tokens_per_s"] is None  # not a language model


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--strategy", "amq"], "unknown strategy 'amq' (did you mean 'amp'?)"),
        (["--strategy", "amp:dtype=fp8"], "dtype: 'fp8' is not one of 'bf16' | 'fp16'"),
        (["--strategy", "amp:precision=bf16"], "unknown key 'precision'"),
        (["--strategy", "amp:dtype=fp16", "--device", "cpu"], "needs a CUDA device"),
        (["--micro-batch-size", "3", "--global-batch-size", "8", "--strategy", "accumulation"],
         "not a multiple of micro_batch_size 3"),
        (["--global-batch-size", "16"], "add [strategies.accumulation]"),
        (["--arg", "layerz=2"], "unknown key 'layerz'"),
        (["--workload", "nosuch.module:build"], "cannot import module 'nosuch.module'"),
        (["--workload", "gtp"], "unknown workload 'gtp' (did you mean 'gpt'?)"),
        (["--strategy", "checkpoint:every=0"], "every: must be 1 or more"),
        (["--strategy", "fused:layernorm=triton"], "use 'eager' or 'compile'"),
    ],
)
def test_mistakes_are_one_line_exit_2_nothing_run(tmp_path, capsys, args, expected):
    out = tmp_path / "never"
    code = main(["bench", "--device", "cpu", *args, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_bad_plan_files(tmp_path, capsys):
    cases = {
        "missing.toml": None,
        "junk.toml": "this is = = not toml",
        "types.toml": 'steps = "ten"',
        "unknown.toml": "stepz = 3",
        "binary.toml": b"\x00\xff\xfe",
    }
    for name, content in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        assert main(["bench", str(path), "--out", str(tmp_path / "o")]) == 2, name
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and name in err, err
    assert not (tmp_path / "o").exists()


def test_estimate_prints_breakdown(capsys):
    assert main(["estimate", str(PLANS / "checkpoint.toml")]) == 0
    out = capsys.readouterr().out
    assert "peak memory" in out and "activations" in out


def test_strategies_lists_the_registry(capsys):
    assert main(["strategies", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    names = {s["name"] for s in listing}
    assert {"amp", "checkpoint", "accumulation", "fused", "lamb"} <= names
    amp = next(s for s in listing if s["name"] == "amp")
    assert amp["settings"]["dtype"]["space"] == "'bf16' | 'fp16'"
    assert amp["phases"] == ["step"] and amp["requires"]
    assert main(["strategies"]) == 0
    assert "requires" in capsys.readouterr().out


@pytest.mark.parametrize("plan", sorted(p.name for p in PLANS.glob("*.toml")))
def test_every_shipped_plan_is_valid(plan, capsys):
    code = main(["estimate", str(PLANS / plan), "--json"])
    err = capsys.readouterr().err
    if plan == "amp-fp16.toml":  # CUDA only: refused here with the reason
        assert code == 2 and "CUDA" in err
    else:
        assert code == 0, err


def test_a_calibration_measured_low_is_flagged_and_dropped(tmp_path, monkeypatch):
    """A cached peak below what a trial achieves (measured on a loaded machine) makes the
    record say MFU against it means nothing, and is dropped so the next trial re-measures."""
    import torch

    from training_harness.measure import cache
    from training_harness.measure import peaks as cal

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    cpu = torch.device("cpu")
    low = {"flops": 1e6, "source": "a test's low figure", "measured_at": "then"}
    keys = []
    for threads in range(1, 9):  # the trial process picks its own thread count
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        keys.append(cal.peak_key(cpu, cal.device_name(cpu), "fp32"))
    monkeypatch.undo()
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    cache.write(cal.CACHE_FILE, {k: low for k in keys})
    out = tmp_path / "low"
    # the tiny GPT: any model outruns a 1 MFLOP/s peak, and this one runs in seconds
    proc = harness("bench", "--workload", "gpt", *TINY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    m = json.loads((out / "result.json").read_text())["metrics"]
    assert m["mfu_measured_peak"] > 1 and "measured low" in m["peak_flops"]["warning"]
    assert len(cache.read(cal.CACHE_FILE)) == len(keys) - 1  # that one dropped
    assert "measured low" in proc.stdout
