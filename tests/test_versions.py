"""Drift seen early: a dependency outside the range the harness declares, or an optional
one missing, is one line and exit 2, before anything is started (docs/dependencies.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from training_harness.cli.main import main
from training_harness.core import versions
from training_harness.core.errors import HarnessError
from training_harness.workloads import optional

ROOT = Path(__file__).resolve().parents[1]
TINY_HF = ["--workload", "hf:llama", "--arg", "num_hidden_layers=1", "--arg", "hidden_size=32",
           "--arg", "intermediate_size=64", "--arg", "num_attention_heads=2",
           "--arg", "num_key_value_heads=2", "--arg", "vocab_size=64", "--arg", "seq_len=16"]
TINY_GPT = ["--workload", "gpt", "--arg", "layers=1", "--arg", "hidden=32", "--arg", "heads=2",
            "--arg", "seq_len=16", "--arg", "vocab=64", "--steps", "2", "--warmup-steps", "1"]


@pytest.fixture
def installed(monkeypatch):
    """Pretend these versions are installed (None: not installed)."""
    real = metadata.version

    def pretend(pairs: dict[str, str | None]) -> None:
        def version(name: str) -> str:
            if name in pairs:
                if pairs[name] is None:
                    raise metadata.PackageNotFoundError(name)
                return pairs[name]
            return real(name)

        monkeypatch.setattr(metadata, "version", version)
    return pretend


def test_the_ranges_are_read_from_the_installed_metadata():
    got = {(d.name, d.extra): d.spec for d in versions.declared()}
    assert set(got[("torch", None)].split(",")) == {">=2.6", "<2.14"}
    assert "<6" in got[("transformers", "hf")].split(",") and got[("torchao", "fp8")]
    assert all(name != "training-harness" for name, _ in got)


def test_a_version_outside_its_range_is_one_line_with_the_fix(installed):
    assert versions.drift() == []  # the environment these tests run in
    installed({"transformers": "6.1.0"})
    (line,) = versions.drift()
    assert line.startswith("transformers 6.1.0 is installed; the harness is tested with "
                           "transformers") and "pip install 'transformers" in line
    with pytest.raises(HarnessError, match="transformers 6.1.0"):
        optional.require("transformers", "hf")
    assert versions.explain(ImportError("cannot import name 'X'")).startswith(
        "ImportError: cannot import name 'X'; transformers 6.1.0")


def test_the_command_refuses_a_core_dependency_out_of_range_or_missing(installed, capsys):
    installed({"optuna": "6.0.0"})
    assert main(["strategies"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "optuna 6.0.0 is installed" in err and "optuna<6" in err
    installed({"optuna": None})
    assert main(["strategies"]) == 2
    assert "optuna is not installed" in capsys.readouterr().err


def test_an_import_that_fails_says_which_dependency_drifted(installed, capsys, monkeypatch):
    from training_harness.cli import main as cli_main

    def broken(args):
        raise ImportError("cannot import name 'AutoConfig' from 'transformers'")

    monkeypatch.setattr(cli_main, "cmd_strategies", broken)
    with pytest.raises(ImportError):  # every dependency in range: a bug, its traceback
        main(["strategies"])
    installed({"transformers": "6.0.0"})
    assert main(["strategies"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot import name 'AutoConfig'" in err
    assert "transformers 6.0.0 is installed" in err


def _without(packages: list[str], argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`harness ARGV` in a fresh process (and its children) where `packages` are not
    importable: a sitecustomize on PYTHONPATH blocks them as an uninstalled one is."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor name in {packages!r}:\n    sys.modules[name] = None\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "training_harness", *argv], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("packages, argv, says", [
    (["transformers"], ["bench", *TINY_HF], "pip install 'training-harness[hf]'"),
    (["torchao"], ["bench", *TINY_GPT, "--strategy", "float8:emulate=true"], "'.[fp8]'"),
    (["submitit"], ["bench", *TINY_GPT, "--launcher", "slurm"], "needs submitit"),
], ids=["hf-without-transformers", "float8-without-torchao", "slurm-without-submitit"])
def test_a_missing_optional_package_is_one_line_and_nothing_started(packages, argv, says,
                                                                    tmp_path):
    done = _without(packages, [*argv, "--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and says in error[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
