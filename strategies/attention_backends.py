"""The attention `fused` can run: SDPA's backend (`sdpa_backend`) and FlexAttention
(`attention = "flex"`), and where each one cannot run, in words.

The backend is entered as a step context (`torch.nn.attention.sdpa_kernel`) rather than
around the built-in cores' SDPA call: a step context reaches every
scaled_dot_product_attention of the step, transformers' own (`hf:` models with
attn_implementation "sdpa") as well as the GPT's, and it is entered once per step.
SDPA refuses a call its only allowed backend cannot take ("No available kernel"), so a
trial never runs another kernel than the one named.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SDPA_BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
BACKEND_CHOICES = ("auto", *SDPA_BACKENDS)  # auto: torch's own choice per call


def backend_context(name: str):
    """The step context that allows SDPA only the `name` backend."""
    return lambda: sdpa_kernel(SDPA_BACKENDS[name])


@lru_cache(maxsize=8)
def cpu_backends(dropout: bool) -> frozenset[str]:
    """The SDPA backends that run forward and backward on this CPU build of torch: one
    tiny causal call under each (about a millisecond each, once per process)."""
    q = torch.randn(1, 1, 8, 8, requires_grad=True)
    ok = set()
    for name, backend in SDPA_BACKENDS.items():
        with contextlib.suppress(RuntimeError):
            with warnings.catch_warnings(), sdpa_kernel(backend):
                warnings.simplefilter("ignore")  # torch's "kernel not used because ..."
                F.scaled_dot_product_attention(q, q, q, is_causal=True,
                                               dropout_p=0.1 if dropout else 0.0).sum().backward()
            ok.add(name)
    return frozenset(ok)


def cuda_capability() -> tuple[int, int] | None:
    # device properties only: no CUDA context in the process that checks plans
    return torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None


def attention_dropout(workload: str, args: dict[str, Any]) -> float:
    """The workload's attention dropout (the GPT's `dropout`, an hf: config's
    attention_dropout / attn_pdrop / attention_probs_dropout_prob), 0 when unknown."""
    return _dropout(workload, json.dumps(args, sort_keys=True, default=str))


@lru_cache(maxsize=64)
def _dropout(workload: str, args_json: str) -> float:
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import load_workload

    try:
        w = load_workload(workload, json.loads(args_json))
    except HarnessError:
        return 0.0  # the workload's own check says what is wrong with it
    cfg = getattr(w, "cfg", None) or getattr(w, "config", None)
    for field in ("dropout", "attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"):
        value = getattr(cfg, field, None)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def hf_refuses(workload: str, args: dict[str, Any], implementation: str) -> str | None:
    """What an hf: model (built on meta) says when switched to `implementation` (its
    `set_attn_implementation` checks the model supports it), None when it takes it or
    is no hf: model."""
    if not workload.startswith("hf:"):
        return None
    return _hf_refuses(workload, json.dumps(args, sort_keys=True, default=str), implementation)


@lru_cache(maxsize=64)
def _hf_refuses(workload: str, args_json: str, implementation: str) -> str | None:
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import load_workload

    try:
        w = load_workload(workload, json.loads(args_json))
        with torch.device("meta"):
            model = w.build_model()
    except HarnessError:
        return None  # the workload's own check says what is wrong with it
    try:
        model.set_attn_implementation(implementation)
    except (ValueError, TypeError, NotImplementedError, ImportError) as e:
        return str(e).strip().splitlines()[0][:160]
    return None


def attention_reasons(settings: Any, plan: Any, env: Any) -> list[str]:
    """Why `fused`'s attention or sdpa_backend cannot run here (one line each)."""
    backend, reasons = settings.sdpa_backend, []
    dropout = attention_dropout(plan.workload, plan.workload_args) > 0
    if settings.attention == "flex":
        if env.device_type == "cpu":
            reasons.append("fused attention = 'flex': torch's FlexAttention has no backward "
                           "on the CPU (torch 2.13); use attention = 'sdpa'")
        elif not env.triton:
            reasons.append("fused attention = 'flex' is compiled to a Triton kernel on a GPU; "
                           "install triton or use attention = 'sdpa'")
        if dropout:
            reasons.append("fused attention = 'flex' has no attention dropout, and the "
                           "workload's is above 0: use attention = 'sdpa' or dropout = 0")
        why = hf_refuses(plan.workload, plan.workload_args, "flex_attention")
        if why:
            reasons.append(f"fused attention = 'flex': {plan.workload} has no FlexAttention "
                           f"in transformers ({why}); use attention = 'sdpa'")
    if backend == "auto":
        return reasons
    if settings.attention != "sdpa":
        reasons.append(f"fused sdpa_backend = '{backend}' picks SDPA's kernel, and attention "
                       f"= '{settings.attention}' calls no SDPA: set attention = 'sdpa' or "
                       "sdpa_backend = 'auto'")
        return reasons
    if env.device_type == "cpu":
        if backend not in cpu_backends(dropout):
            runs = ", ".join(f"'{b}'" for b in sorted(cpu_backends(dropout)))
            why = " with attention dropout" if dropout and backend in cpu_backends(False) else ""
            reasons.append(f"fused sdpa_backend = '{backend}' does not run on this CPU{why} "
                           f"(torch {torch.__version__}); use {runs} or 'auto'")
        return reasons
    reasons += _cuda_reasons(backend, plan, env)
    return reasons


def _cuda_reasons(backend: str, plan: Any, env: Any) -> list[str]:
    """Flash and cuDNN attention need Ampere (8.0) or newer and 16-bit inputs (amp);
    the memory-efficient kernel runs on every GPU torch supports, fp32 too."""
    if backend in ("math", "efficient"):
        return []
    cap = cuda_capability()
    if cap is not None and cap < (8, 0):
        return [f"fused sdpa_backend = '{backend}' needs compute capability 8.0 or newer; "
                f"{env.device_name} is {cap[0]}.{cap[1]}: use 'efficient'"]
    if "amp" not in plan.strategies:
        return [f"fused sdpa_backend = '{backend}' takes fp16/bf16 inputs only, and without "
                "amp attention runs in fp32: add [strategies.amp] or use 'efficient'"]
    return []
