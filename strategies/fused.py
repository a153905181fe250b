"""Fused kernels: SDPA attention, our Triton kernels, fused optimizers, torch.compile."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from training_harness.core.errors import HarnessError
from training_harness.kernels import dispatch
from training_harness.strategies.attention_backends import (
    BACKEND_CHOICES,
    attention_reasons,
    backend_context,
)
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.kernel_swaps import SWAPS, swap_linear_cross_entropy
from training_harness.strategies.registry import get, register
from training_harness.workloads import load_workload
from training_harness.workloads.attention import swap_attention
from training_harness.workloads.blocks import find_blocks
from training_harness.workloads.hf import set_attention
from training_harness.workloads.hf_head import fused_head_reasons

KernelMode = Literal["eager", "compile", "triton"]
CompileMode = Literal["default", "max-autotune-no-cudagraphs", "reduce-overhead",
                      "max-autotune"]
COMPILE_MODES = get_args(CompileMode)
CUDA_GRAPHS = ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs


@dataclass
class FusedSettings:
    attention: Literal["explicit", "sdpa", "flex"] = "sdpa"  # flex: FlexAttention, causal
    # SDPA's kernel for every SDPA call of the step (strategies.attention_backends);
    # auto: torch's choice per call
    sdpa_backend: Literal["auto", "math", "efficient", "flash", "cudnn"] = "auto"
    optimizer: Literal["default", "foreach", "fused", "triton"] = "fused"
    compile: bool = False  # torch.compile each block
    # torch.compile's mode (CUDA only but "default"): "max-autotune-no-cudagraphs" tunes
    # the Triton kernels and matmul choices; "reduce-overhead" replays CUDA graphs (the
    # lever for launch-bound small models); "max-autotune" does both (the longest compile)
    compile_mode: CompileMode = "default"
    layernorm: KernelMode = "eager"
    gelu: KernelMode = "eager"  # the MLP's bias + GELU
    cross_entropy: KernelMode = "eager"
    # The LM head's matmul and the loss in one, over chunks of tokens, the gradients made
    # in forward (kernels.linear_cross_entropy): the (tokens x vocab) logits are never
    # held. The gpt workload and hf: causal LMs whose logits are the head's output as is.
    linear_cross_entropy: bool = False


def triton_unavailable(device_type: str) -> str | None:
    probe = torch.empty(0) if device_type == "cpu" else None  # no CUDA context here
    return dispatch.why_not_triton(probe)


def has_compiler() -> bool:
    return any(shutil.which(c) for c in ("gcc", "cc", "clang"))


class Fused(Strategy):
    name = "fused"
    summary = ("fused kernels: SDPA (its backend a setting) or FlexAttention, Triton "
               "LayerNorm / bias+GELU / cross-entropy, "
               "fused linear cross-entropy, fused or multi-tensor optimizer, torch.compile")
    phases = (Phase.MODULE_SWAP, Phase.COMPILE, Phase.OPTIMIZER)
    Settings = FusedSettings
    requires = ("triton: a CUDA device (or TRITON_INTERPRET=1); "
                "compile: gcc on a CPU, Triton on a GPU; linear_cross_entropy: the gpt "
                "workload or an hf: causal LM whose logits are its head's output")

    def space(self):
        kernel = Choice(("eager", "compile", "triton"))
        return {
            "attention": Choice(("explicit", "sdpa", "flex")),
            "sdpa_backend": Choice(BACKEND_CHOICES),
            "optimizer": Choice(("default", "foreach", "fused", "triton")),
            "compile": Choice((False, True)),
            "compile_mode": Choice(COMPILE_MODES),
            "layernorm": kernel,
            "gelu": kernel,
            "cross_entropy": kernel,
            "linear_cross_entropy": Choice((False, True)),
        }

    def availability(self) -> dict[str, str]:
        return dispatch.available()

    def check(self, settings, plan, env):
        reasons = []
        wants_triton = [k for k in SWAPS if getattr(settings, k) == "triton"]
        if settings.optimizer == "triton":
            wants_triton.append("optimizer")
        why = triton_unavailable(env.device_type) if wants_triton else None
        if why:
            reasons.append(f"fused {', '.join(wants_triton)} = 'triton': {why}; use 'eager' "
                           "or 'compile' (or 'fused' for the optimizer)")
        wants_compile = settings.compile or any(getattr(settings, k) == "compile" for k in SWAPS)
        if wants_compile and env.device_type == "cpu" and not has_compiler():
            reasons.append("fused compile on the CPU needs a C compiler (gcc); use 'eager'")
        if wants_compile and env.device_type == "cuda" and not env.triton:
            reasons.append("fused compile on a GPU needs Triton (pip install triton); use 'eager'")
        reasons += compile_mode_reasons(settings, plan, env)
        reasons += attention_reasons(settings, plan, env)
        if settings.optimizer == "triton":
            reasons += triton_optimizer_reasons(plan, env)
        if settings.linear_cross_entropy:
            reasons += linear_cross_entropy_reasons(settings, plan)
        return reasons

    def apply(self, phase, setup, settings):
        model = setup.model
        if phase is Phase.MODULE_SWAP:
            swapped = swap_attention(model, settings.attention)
            done = [f"{swapped} attention -> {settings.attention}"]
            if set_attention(model, settings.attention):  # a transformers model
                done = [f"transformers attn_implementation -> {model.config._attn_implementation}"]
            for kernel, swap in SWAPS.items():
                mode = getattr(settings, kernel)
                if mode != "eager":
                    done.append(f"{swap(model, mode)} {kernel} -> {mode}")
            if settings.linear_cross_entropy:
                done.append(swap_linear_cross_entropy(model))
            if settings.sdpa_backend != "auto":
                setup.step_contexts.append(backend_context(settings.sdpa_backend))
                done.append(f"SDPA backend {settings.sdpa_backend} in each step")
            setup.notes.append("fused: " + ", ".join(done))
        elif phase is Phase.COMPILE and settings.compile:
            # Per block, as torchtitan does: shorter compiles, and wrappers applied
            # later (pipeline split, FSDP) see ordinary modules.
            blocks = find_blocks(model)
            mode = None if settings.compile_mode == "default" else settings.compile_mode
            for block in blocks if blocks is not None else [model]:
                block.compile(mode=mode)
            if settings.compile_mode in CUDA_GRAPHS:
                # CUDA graph trees: each step starts a new generation of graph outputs
                setup.step_contexts.append(_cudagraph_step)
            setup.notes.append(f"fused: compiled {blocks.describe() if blocks else 'the model'}"
                               f" (mode {settings.compile_mode})")
        elif phase is Phase.OPTIMIZER:
            setup.optimizer_impl = settings.optimizer


def compile_mode_reasons(settings: FusedSettings, plan, env) -> list[str]:
    """Why the compile mode cannot apply here: only "default" off CUDA (refused there even
    with compile off, so that a CPU study's search never offers the others)."""
    mode = settings.compile_mode
    if mode == "default":
        return []
    if env.device_type != "cuda":
        what = {"reduce-overhead": "CUDA graphs", "max-autotune-no-cudagraphs":
                "Triton kernel autotuning"}.get(mode, "Triton kernel autotuning and CUDA graphs")
        return [f"fused compile_mode '{mode}' is for CUDA ({what}); on {env.device_type} use "
                "compile_mode = 'default'"]
    reasons = []
    if mode in CUDA_GRAPHS and settings.compile:
        zero = plan.strategies.get("zero")
        if zero is not None and get("zero").parse(zero).stage >= 2:
            reasons.append(f"fused compile_mode '{mode}' (CUDA graphs) replays fixed "
                           "addresses, but FSDP (zero stage 2/3) gathers the parameters into "
                           "new memory each step: use 'max-autotune-no-cudagraphs'")
        if "pipeline" in plan.strategies:
            reasons.append(f"fused compile_mode '{mode}' (CUDA graphs) overwrites a "
                           "block's outputs on its next forward, and the pipeline runs several "
                           "micro-batches forward before their backward: use "
                           "'max-autotune-no-cudagraphs'")
    return reasons


def linear_cross_entropy_reasons(settings: FusedSettings, plan) -> list[str]:
    """Where the fused linear cross-entropy cannot stand in for the head and its loss: a
    model that is not a language model the harness knows the head of, a head whose
    logits are changed before the loss (hf: models, read from their forward), a loss
    that needs the whole logits (distillation), or a cross-entropy kernel beside it."""
    reasons = []
    if plan.workload.startswith("hf:"):
        try:
            workload = load_workload(plan.workload, dict(plan.workload_args))
        except HarnessError as e:
            return [str(e)]
        reasons += fused_head_reasons(workload)
    elif plan.workload != "gpt":
        reasons.append(f"fused linear_cross_entropy fuses a language model's head with its "
                       f"loss: the gpt workload or an hf: causal LM, not '{plan.workload}'; "
                       "set linear_cross_entropy = false")
    if settings.cross_entropy != "eager":
        reasons.append(f"fused linear_cross_entropy computes the loss itself, so "
                       f"cross_entropy = '{settings.cross_entropy}' has no logits to act on; "
                       "set cross_entropy = 'eager'")
    if "distill" in plan.strategies:
        reasons.append("fused linear_cross_entropy with distill: the teacher's KL term needs "
                       "the student's whole logits; set linear_cross_entropy = false")
    return reasons


def triton_optimizer_reasons(plan, env) -> list[str]:
    """Where the Triton multi-tensor optimizer cannot step. Sharded parameters (FSDP's
    zero stage 2/3, tensor parallel) are DTensors: AdamW steps their local shards
    (element-wise, so that is the whole step), but LAMB's trust ratio needs each
    tensor's whole norm, which one shard does not hold. ZeRO offload steps the
    optimizer on parameters that live on the CPU, where no Triton kernel runs (on a
    CPU device offload moves nothing, and the interpreter runs there)."""
    reasons = []
    zero = plan.strategies.get("zero")
    zero = get("zero").parse(zero) if zero is not None else None
    sharded = [name for name, on in (("zero stage 2/3", zero is not None and zero.stage >= 2),
                                      ("tensor parallel", "tensor" in plan.strategies)) if on]
    if "lamb" in plan.strategies and sharded:
        reasons.append(f"fused optimizer = 'triton' with lamb: LAMB's trust ratio needs each "
                       f"tensor's whole norm, and with {' and '.join(sharded)} a rank's kernel "
                       "sees one shard; use optimizer = 'foreach' (norms over the whole "
                       "sharded tensor)")
    if zero is not None and zero.offload and env.device_type == "cuda":
        reasons.append("fused optimizer = 'triton' with zero offload: the optimizer steps "
                       "parameters held on the CPU, where no Triton kernel runs; use "
                       "optimizer = 'foreach' or 'default'")
    return reasons


@contextlib.contextmanager
def _cudagraph_step():
    torch.compiler.cudagraph_mark_step_begin()
    yield


register(Fused())
