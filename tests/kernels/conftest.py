"""Kernel tests: the Triton kernels against float64 references, on CUDA if present,
else on the CPU through Triton's interpreter.

Why TRITON_INTERPRET is set here, at import: triton reads it once, when it is first
imported (its own library, tl.sum and the like, is decorated then), so it has to be
set before anything imports triton. This conftest imports triton in interpreter
mode with the variable set, then restores the variable, so that tests outside this
folder keep the plain dispatch (CPU -> reference); the `_interpret` fixture sets it
again around each test here, which sends CPU tensors through the interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if ON_CUDA else "cpu"

if not ON_CUDA and "triton" not in sys.modules:
    _before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401  (fixes interpreter mode for this process)
    except ImportError:
        pass  # the test modules skip themselves
    finally:
        if _before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _before

# Tolerances against the float64 reference (computed from the same rounded inputs):
# rtol, and atol as a fraction of the reference's largest magnitude, or of 1 when
# that is smaller (an exact 0, such as LayerNorm's dx at width 1, is 1e-14 in fp64).
# fp32 results must agree to a few fp32 ulps; bf16 results to ~2.5 bf16 roundings
# (unit roundoff 2^-8 = 0.0039): the kernels compute in fp32 and round once.
TOLERANCES = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (1e-2, 1e-3)}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Run the kernels here: in the interpreter on the CPU, natively on CUDA."""
    from training_harness.kernels import dispatch as kernels

    if not ON_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    reason = kernels.why_not_triton(torch.empty(0, device=DEVICE))
    if reason is not None and kernels.triton_import_error() is None:
        pytest.fail(f"the Triton kernels cannot run on {DEVICE}: {reason}")


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def assert_matches():
    """assert_matches(actual, expected_float64, dtype, what, scale=None): within
    TOLERANCES[dtype]; `scale` (default: the reference's largest magnitude, or 1) is
    what atol is a fraction of: the size of the terms a result is the difference of,
    where it cancels to (near) zero."""

    def check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "",
              scale: float | None = None):
        rtol, atol_frac = TOLERANCES[dtype]
        largest = expected.abs().max().item() if expected.numel() else 0.0
        scale = max(largest, 1.0, scale or 0.0)
        atol = atol_frac * scale
        torch.testing.assert_close(
            actual.detach().double().cpu(), expected.detach().double().cpu(), rtol=rtol,
            atol=atol, msg=lambda m: f"{what} ({dtype}, rtol={rtol}, atol={atol:.3g}): {m}",
        )

    return check
