"""Module swaps for the `fused` strategy: each kernel eager, compiled, or Triton.

Every swap keeps the same Parameter objects, so the state dict, the optimizer and
the numerics (within the kernels' stated tolerances) are unchanged.
"""

from __future__ import annotations

from torch import nn

from training_harness.kernels.bias_gelu import LinearBiasGELU
from training_harness.kernels.cross_entropy import ChunkedCrossEntropy
from training_harness.kernels.layernorm import FusedLayerNorm
from training_harness.kernels.linear_cross_entropy import LinearCrossEntropy, chunk_rows
from training_harness.workloads.hf_head import CRITERION


def _children(model: nn.Module):
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            yield parent, name, child


def _swap_exact(model: nn.Module, cls: type, mode: str, to_triton) -> int:
    """Every module of exactly `cls` -> compiled in place, or `to_triton(module)`."""
    n = 0
    for parent, name, child in _children(model):
        if type(child) is cls:
            if mode == "triton":
                setattr(parent, name, to_triton(child))
            elif mode == "compile":
                child.compile()
            n += 1
    return n


def swap_layernorm(model: nn.Module, mode: str) -> int:
    """nn.LayerNorm -> compiled, or our Triton FusedLayerNorm."""
    return _swap_exact(model, nn.LayerNorm, mode,
                       lambda m: FusedLayerNorm.from_layernorm(m, impl="triton"))


def swap_bias_gelu(model: nn.Module, mode: str) -> int:
    """An MLP's `up` Linear followed by `act` GELU -> one bias+GELU after the matmul.

    "compile" compiles the reference bias+GELU (Inductor fuses it); "triton" runs
    our kernel. Matches the GPT's and ViT's MLP (attributes `up` and `act`).
    """
    n = 0
    for module in list(model.modules()):
        up, act = getattr(module, "up", None), getattr(module, "act", None)
        if isinstance(up, nn.Linear) and isinstance(act, nn.GELU) and up.bias is not None:
            impl = "triton" if mode == "triton" else "reference"
            fused = LinearBiasGELU.from_linear(up, act.approximate, impl)
            if mode == "compile":
                fused.compile()
            module.up, module.act = fused, nn.Identity()
            n += 1
    return n


def swap_cross_entropy(model: nn.Module, mode: str) -> int:
    """nn.CrossEntropyLoss modules -> compiled, or our chunked in-place Triton kernel."""
    return _swap_exact(model, nn.CrossEntropyLoss, mode,
                       lambda m: ChunkedCrossEntropy.from_loss(m, impl="triton"))


def swap_linear_cross_entropy(model: nn.Module) -> str:
    """The LM head and its loss -> one fused linear cross-entropy (kernels.linear_cross_entropy):
    the gpt's `criterion` (its forward then hands the head's input and weight to it,
    not the logits), or a transformers model's `CRITERION` attribute (its workload's loss runs
    the model with the head on no positions and the fused loss on the head's input).
    Returns what was swapped, for the notes."""
    criterion = getattr(model, "criterion", None)
    if isinstance(criterion, nn.CrossEntropyLoss):
        model.criterion = LinearCrossEntropy.from_loss(criterion)
        return "criterion -> linear cross-entropy"
    if hasattr(getattr(model, "config", None), "model_type"):  # a transformers model
        setattr(model, CRITERION, LinearCrossEntropy())
        return "output embeddings + loss -> linear cross-entropy"
    raise ValueError(f"fused linear_cross_entropy: {type(model).__name__} has neither a "
                     "CrossEntropyLoss `criterion` nor a transformers config")


__all__ = ["SWAPS", "chunk_rows", "swap_linear_cross_entropy"]  # chunk_rows: the estimator's

SWAPS = {"layernorm": swap_layernorm, "gelu": swap_bias_gelu, "cross_entropy": swap_cross_entropy}
