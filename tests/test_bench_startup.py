"""`harness bench`'s fixed cost: what its path imports, and that it leaves no process
behind. No timing here (tests/benchmarks/bench_startup.py measures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

# What the quickstart plan's path (its plan prepared, its trial run) must not import: each
# is seconds of imports that only some plans use (a compiled plan imports inductor's
# compiler, a ZeRO-1 plan torch.distributed.optim, an HF workload transformers), or the
# tuner's and the reports' own. torch._dynamo is not here: torch.optim's optimizers
# import it in their constructor and at each step (torch 2.13), so every trial pays it.
HEAVY = ("transformers", "torchvision", "timm", "torch.distributed.optim",
         "torch._inductor.compile_fx", "torch._functorch.aot_autograd",
         "torch.distributed.pipelining", "torch.distributed.checkpoint", "optuna", "pandas",
         "plotly", "scipy")

QUICKSTART_PATH = """
import gc, json, sys
from pathlib import Path
import training_harness.measure.rank_preload  # the rank server's preload, as the server runs it
preload = {"gc_on": gc.isenabled(), "frozen": gc.get_freeze_count(),
           "dynamo": "torch._dynamo" in sys.modules}
from training_harness.core.config import read_toml
from training_harness.core.plan import Plan
from training_harness.measure import rank_main
from training_harness.measure.prepare import prepare
out = Path(sys.argv[1])
data = {**read_toml("studies/plans/quickstart.toml"), "device": "cpu", "steps": 1,
        "warmup_steps": 1}
prepare(Plan.from_dict(data, where="test")).checked().write(out / "prepared.json")
rc = rank_main.main([str(out / "prepared.json"), "--result", str(out / "result.json"),
                     "--command", "test"])
print(json.dumps({"rc": rc, **preload, "heavy": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quickstart_path_imports_nothing_heavy_it_does_not_use(tmp_path):
    """The rank server's preload, then the quickstart plan prepared and its trial run in
    that one process (as its forks would): none of HEAVY comes in, and the preload
    leaves the collector on, with what it imported frozen."""
    done = subprocess.run([sys.executable, "-c", QUICKSTART_PATH, str(tmp_path), *HEAVY],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "ok"
    assert got["heavy"] == []
    assert got["dynamo"] and got["gc_on"] and got["frozen"] > 100_000


def _ours(marker: str) -> list[psutil.Process]:
    """The processes whose environment carries `marker` (a command's, and all it started)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("HARNESS_TEST_MARK") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.timeout(200)
def test_no_process_outlives_a_bench(tmp_path):
    """After `harness bench` exits, nothing it started runs: not its rank server, nor the
    torch-side helper, nor a rank. A plan refused as a user's mistake starts nothing."""
    marker = f"bench-{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, "HARNESS_TEST_MARK": marker}
    tiny = ["--workload", "gpt", "--arg", "layers=1", "--arg", "hidden=32", "--arg", "heads=2",
            "--arg", "seq_len=16", "--arg", "vocab=64", "--steps", "2", "--warmup-steps", "1"]
    done = subprocess.run([sys.executable, "-m", "training_harness", "bench", *tiny, "--out",
                           str(tmp_path / "ok")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _ours(marker) == []
    plan = tmp_path / "bad.toml"
    plan.write_text('name = "bad"\nmicro_batch_size = 0\n')
    bad = subprocess.run([sys.executable, "-m", "training_harness", "bench", str(plan), "--out",
                          str(tmp_path / "bad")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "micro_batch_size" in bad.stderr
    assert _ours(marker) == [] and not (tmp_path / "bad").exists()
