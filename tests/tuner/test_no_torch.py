"""The tuner process never imports torch: what needs it runs in the torch-side helper
(training_harness.launch.torch_helper) or in the trials' own processes
(docs/architecture.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.tuner.conftest import FAKE, QUICKSTART, ROOT

TUNER_MODULES = ["training_harness.cli.main", "training_harness.cli.tune",
                 "training_harness.cli.tune_check",
                 "training_harness.tune.session", "training_harness.tune.search.loop",
                 "training_harness.tune.trial_job",
                 "training_harness.tune.final.ablation", "training_harness.tune.recovery.resume",
                 "training_harness.tune.storage",
                 "training_harness.launch.local", "training_harness.launch.torch_helper",
                 "training_harness.study.search_space",
                 "training_harness.records.run_store"]

# torch made unimportable in the tuner's process: any import of it raises.
BLOCKED = "import sys; sys.modules['torch'] = None\n"


def run_python(code: str, timeout: float = 240, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -c code` in `cwd`, with the checkout importable (harness, tests)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_tuner_modules_import_without_torch():
    code = (f"import importlib, sys\nfor m in {TUNER_MODULES!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    done = run_python("import json\n" + code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_a_whole_study_runs_with_torch_unimportable_in_the_tuner(tmp_path):
    """--check, a search and the ablation, trials prepared by the helper: the tuner's
    own process could not have imported torch (it would have raised). It runs in a
    folder of its own, so what the user's runs left in the checkout's runs/ has no say."""
    run = tmp_path / "run"
    code = BLOCKED + textwrap.dedent(f"""
        from training_harness.cli.main import main
        assert main(["tune", {str(QUICKSTART)!r}, "--check"]) == 0  # runs/quickstart, here
        assert main(["tune", {str(QUICKSTART)!r}, "--check", "--out", {str(run)!r}]) == 0
        code = main(["tune", {str(QUICKSTART)!r}, "--budget", "20s", "--n-trials", "4",
                     "--out", {str(run)!r}, "--launcher", {FAKE!r}, "--quiet"])
        print("exit", code)
    """)
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "exit 0" in done.stdout
    assert not (tmp_path / "runs").exists(), "--check made the default run folder"
    records = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    assert records and any(r["status"] == "ok" for r in records)
    # The plans were prepared (checked, resolved, estimated) by the helper, with torch.
    assert all(r["predicted"] and r["predicted"].get("peak_memory_bytes") for r in records
               if r["status"] == "ok")
