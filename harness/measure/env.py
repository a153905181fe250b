"""The environment a result was measured in, recorded with every result.

`capture_env` never raises: a figure it cannot get is None. Everything in it is
JSON-serialisable. Environment variables are kept only where they change how
training runs (threads, devices, allocator, NCCL, torch) and never where the
name suggests a secret.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import torch

from training_harness.core.device import cpu_capability, cpu_flags, cpu_name

T = TypeVar("T")

_ENV_PREFIXES = (
    "TORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "PYTORCH_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NCCL_",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_NUM_THREADS",
    "TRITON_",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HARNESS_",
)
_ENV_NAMES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")
_SECRET = re.compile(r"TOKEN|SECRET|PASS|KEY|CRED|AUTH|COOKIE|SESSION|PRIVATE|STORAGE|URL|DSN",
                     re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@/\s]*@")  # scheme://user:PASSWORD@host

_PACKAGES = ("triton", "optuna", "numpy", "nvidia-ml-py", "pytorch-triton")


def _safe(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:  # a figure we cannot get is None, never an error
        return None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_tree() -> Path:
    """The directory holding the `harness` package."""
    return Path(__file__).resolve().parent.parent


def git_commit() -> dict[str, Any] | None:
    """{"commit", "dirty"} of the harness source tree, or None outside a git checkout."""
    root = source_tree()
    if not (root / ".git").exists():
        return None
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _env_vars() -> dict[str, str]:
    keep = {}
    for name, value in os.environ.items():
        if _SECRET.search(name):
            continue
        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
            keep[name] = _URL_PASSWORD.sub(r"\1***@", value)
    return dict(sorted(keep.items()))


def _gpus(device: torch.device) -> list[dict[str, Any]] | None:
    """The visible CUDA devices; for a CPU trial through NVML, so no CUDA context is made."""
    if device.type == "cuda":
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return [{"index": i, "name": p.name, "total_memory_bytes": int(p.total_memory),
                 "capability": f"{p.major}.{p.minor}",
                 "multiprocessors": int(p.multi_processor_count)} for i, p in enumerate(props)]
    from training_harness.measure.nvml import gpu_names

    return [{"index": i, "name": name} for i, name in enumerate(gpu_names())]


def _nccl_version() -> str | None:
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return None
    v = torch.cuda.nccl.version()
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def _matmul_precision() -> str | None:
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision not in (None, "none"):
        return str(precision)
    return torch.get_float32_matmul_precision()


def capture_env(device: torch.device) -> dict[str, Any]:
    """Versions, host and devices of this run, as a JSON-ready dict. Never raises."""
    try:
        return _capture(device)
    except Exception as e:  # a bug here must not cost a trial its result
        return {"error": f"{type(e).__name__}: {e}", "torch": getattr(torch, "__version__", None)}


def _capture(device: torch.device) -> dict[str, Any]:
    import training_harness
    from training_harness.measure.nvml import driver_version
    from training_harness.measure.peaks import device_name

    cuda = device.type == "cuda"
    gpus = _safe(lambda: _gpus(device)) or []
    return {
        "harness": training_harness.__version__,
        "git": _safe(git_commit),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": _safe(platform.platform),
        "hostname": _safe(socket.gethostname),
        "cpu": _safe(cpu_name),
        "cpu_capability": _safe(cpu_capability),
        "cpu_flags": _safe(cpu_flags),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _safe(lambda: len(os.sched_getaffinity(0))),
        "torch": torch.__version__,
        "torch_threads": _safe(torch.get_num_threads),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": _safe(lambda: torch.backends.cudnn.version() if cuda else None),
        "nccl": _safe(lambda: _nccl_version() if cuda else None),
        "device": str(device),
        "device_name": _safe(lambda: device_name(device)),
        "gpu_names": [g["name"] for g in gpus],
        "gpus": gpus,
        "driver": _safe(driver_version),
        "float32_matmul_precision": _safe(_matmul_precision),
        "packages": {name: _safe(lambda name=name: metadata.version(name))
                     for name in _PACKAGES},
        "env": _safe(_env_vars) or {},
    }
