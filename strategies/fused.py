"""Fused kernels: SDPA attention, our Triton kernels, fused optimizers, torch.compile."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from typing import Literal

import torch

from training_harness.kernels import dispatch
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.kernel_swaps import SWAPS
from training_harness.strategies.registry import get, register
from training_harness.workloads.attention import swap_attention
from training_harness.workloads.blocks import find_blocks
from training_harness.workloads.hf import set_attention

KernelMode = Literal["eager", "compile", "triton"]
CompileMode = Literal["default", "max-autotune-no-cudagraphs", "reduce-overhead",
                      "max-autotune"]
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
CUDA_GRAPHS = ("reduce-overhead", "max-autotune")  # the modes that replay CUDA graphs


@dataclass
class FusedSettings:
    attention: Literal["explicit", "sdpa"] = "sdpa"
    optimizer: Literal["default", "foreach", "fused", "triton"] = "fused"
    compile: bool = False  # torch.compile each block
    # torch.compile's mode (CUDA only but "default"): "max-autotune-no-cudagraphs" tunes
    # the Triton kernels and matmul choices; "reduce-overhead" replays CUDA graphs (the
    # lever for launch-bound small models); "max-autotune" does both (the longest compile)
    compile_mode: CompileMode = "default"
    layernorm: KernelMode = "eager"
    gelu: KernelMode = "eager"  # the MLP's bias + GELU
    cross_entropy: KernelMode = "eager"


def triton_unavailable(device_type: str) -> str | None:
    probe = torch.empty(0) if device_type == "cpu" else None  # no CUDA context here
    return dispatch.why_not_triton(probe)


def has_compiler() -> bool:
    return any(shutil.which(c) for c in ("gcc", "cc", "clang"))


class Fused(Strategy):
    name = "fused"
    summary = ("fused kernels: SDPA attention, Triton LayerNorm / bias+GELU / cross-entropy, "
               "fused or multi-tensor optimizer, torch.compile")
    phases = (Phase.MODULE_SWAP, Phase.COMPILE, Phase.OPTIMIZER)
    Settings = FusedSettings
    requires = ("triton: a CUDA device (or TRITON_INTERPRET=1); "
                "compile: gcc on a CPU, Triton on a GPU")

    def space(self):
        kernel = Choice(("eager", "compile", "triton"))
        return {
            "attention": Choice(("explicit", "sdpa")),
            "optimizer": Choice(("default", "foreach", "fused", "triton")),
            "compile": Choice((False, True)),
            "compile_mode": Choice(COMPILE_MODES),
            "layernorm": kernel,
            "gelu": kernel,
            "cross_entropy": kernel,
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
        if settings.optimizer == "triton":
            reasons += triton_optimizer_reasons(plan, env)
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
