"""`harness bench`'s fixed cost (issue 34): what its path imports, and its rank server's
early start. No timing here (tests/benchmarks/bench_startup.py measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from training_harness.cli.bench_early import forks_here
from training_harness.launch import rank_server

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


@pytest.mark.parametrize(("argv", "here"), [
    (["studies/plans/quickstart.toml"], True),
    (["plan.toml", "--nnodes", "1", "--launcher", "local", "--out", "x"], True),
    (["plan.toml", "--nnodes=1", "--node-rank", "0"], True),
    (["plan.toml", "--nnodes", "2", "--rdzv-endpoint", "h:1"], False),
    (["plan.toml", "--nnodes=2"], False),
    (["plan.toml", "--launcher", "slurm"], False),
    (["plan.toml", "--launcher=slurm"], False),
    (["plan.toml", "--node-rank", "1"], False),
    (["--help"], False),
    (["plan.toml", "-h"], False),
])
def test_the_server_starts_early_only_where_the_ranks_fork_from_it(argv, here):
    assert forks_here(argv) is here


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


EARLY_REFUSAL = """
import sys
from multiprocessing import forkserver
from training_harness.cli.main import main
sys.argv = ["harness", "bench", sys.argv[1], "--device", "cpu", "--out", sys.argv[2]]
rc = main()  # as the command line runs it (no argv): the server starts first thing
print(rc, "torch" in sys.modules, forkserver._forkserver._forkserver_pid)
"""


@pytest.mark.skipif(not rank_server.enabled(), reason="no forkserver here")
@pytest.mark.timeout(120)
def test_a_plan_refused_early_leaves_no_server_behind(tmp_path):
    """The server starts before the plan is read; a plan refused as a user's mistake
    exits 2 at once, and its server (still importing torch) is stopped with it."""
    plan = tmp_path / "bad.toml"
    plan.write_text('name = "bad"\nmicro_batch_size = 0\n')
    done = subprocess.run([sys.executable, "-c", EARLY_REFUSAL, str(plan), str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    rc, torch_here, pid = done.stdout.split()
    assert (rc, torch_here) == ("2", "False") and "micro_batch_size" in done.stderr
    assert pid != "None"  # it was started
    assert not _alive(int(pid))
    assert not (tmp_path / "o").exists()  # nothing of a trial was made


STOP_NOW = """
from multiprocessing import forkserver
from training_harness.launch import rank_server
rank_server.start_now()
pid = forkserver._forkserver._forkserver_pid
rank_server.stop_now()  # as `harness bench` does once its plan turns out to be Slurm's
print(pid, forkserver._forkserver._forkserver_pid)
"""


@pytest.mark.skipif(not rank_server.enabled(), reason="no forkserver here")
@pytest.mark.timeout(60)
def test_a_server_started_early_can_be_stopped_at_once():
    done = subprocess.run([sys.executable, "-c", STOP_NOW], cwd=ROOT, capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    pid, after = done.stdout.split()
    assert pid != "None" and after == "None"
    assert not _alive(int(pid))
