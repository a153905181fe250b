"""Dispatch: which path runs where, and what `kernels.available()` reports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from training_harness.kernels import dispatch as kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_available_here(device):
    report = kernels.available()
    assert set(report) == set(kernels.KERNELS)
    label = "triton (cuda)" if device == "cuda" else "triton interpreter (TRITON_INTERPRET=1)"
    assert set(report.values()) == {label}
    assert kernels.use_triton(torch.empty(1, device=device))


def test_cpu_without_the_interpreter_takes_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.empty(1)
    assert not kernels.use_triton(x)
    assert "no CUDA device" in kernels.why_not_triton(x)
    assert kernels.resolve("auto", x) is False
    assert kernels.resolve("reference", x) is False
    with pytest.raises(RuntimeError, match="impl='triton' cannot run here"):
        kernels.resolve("triton", x)
    if not torch.cuda.is_available():
        assert all(v.startswith("reference only: no CUDA device")
                   for v in kernels.available().values())


def test_auto_falls_back_on_inputs_the_kernel_does_not_take(device):
    x = torch.empty(1, device=device)
    assert kernels.resolve("auto", x, supported=False) is False
    with pytest.raises(RuntimeError, match="does not handle"):
        kernels.resolve("triton", x, supported=False)
    with pytest.raises(ValueError, match="impl"):
        kernels.resolve("cuda", x)


def _python(code: str, env_interpret: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    if env_interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow  # two new interpreters importing torch
def test_without_triton_and_with_triton_imported_too_early():
    """Two fresh processes: triton missing (everything imports, the reference runs), and
    TRITON_INTERPRET=1 set only after triton was imported (reported, not crashed)."""
    out = _python("""
        import sys
        sys.modules["triton"] = None  # as if not installed
        import torch
        from training_harness.kernels import dispatch as kernels
        from training_harness.kernels import bias_gelu, cross_entropy, layernorm, multi_tensor
        x = torch.randn(3, 8)
        y = layernorm.layer_norm(x)
        assert torch.allclose(y, torch.nn.functional.layer_norm(x, (8,)), atol=1e-6)
        print(sorted(set(kernels.available().values())))
        """)
    # On a GPU machine available() asks about CUDA tensors, whose path needs triton itself.
    expected = "triton does not import" if torch.cuda.is_available() else "triton is not installed"
    assert expected in out
    out = _python("""
        import os, torch, triton
        from training_harness.kernels import dispatch as kernels
        os.environ["TRITON_INTERPRET"] = "1"
        print(kernels.why_not_triton(torch.empty(1)))
        """)
    assert "set after triton was imported" in out
