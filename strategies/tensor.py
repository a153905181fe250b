"""Tensor parallel: each GPT block's matmuls split over the mesh's "tensor" ranks.

Megatron's split, written with torch's DTensor plans: qkv and mlp.up are split
by output rows (ColwiseParallel), proj and mlp.down by input columns
(RowwiseParallel), so each rank computes its own attention heads and its slice
of the MLP, and one all-reduce after proj and after mlp.down restores the full
activations. Norms, embeddings and the head stay replicated.

The fused qkv weight holds [q; k; v]; a plain row split would give rank 0 all
of q. Its rows are first reordered to [q0 k0 v0 | q1 k1 v1 | ...] so that each
rank's contiguous shard holds its q, k and v heads; the block finds its local
head count from the shapes. Sequence parallel (sharding the norms over tokens)
is not done.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from training_harness.core.config import from_table
from training_harness.core.errors import HarnessError
from training_harness.strategies import hf_tensor
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.mesh import submesh
from training_harness.strategies.registry import register
from training_harness.workloads import load_workload
from training_harness.workloads.gpt import GPTConfig


@dataclass
class TensorSettings:
    mlp: bool = True  # split the MLP too (else attention only)


def interleave_qkv(qkv: nn.Linear, ranks: int) -> None:
    """Reorder qkv's output rows from [q; k; v] to [q0 k0 v0 | q1 k1 v1 | ...] in place."""
    with torch.no_grad():
        w = qkv.weight.view(3, ranks, -1, qkv.in_features).transpose(0, 1).reshape_as(qkv.weight)
        qkv.weight.copy_(w)
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias.view(3, ranks, -1).transpose(0, 1).reshape(-1))


class Tensor(Strategy):
    name = "tensor"
    summary = ("tensor parallel: GPT blocks' qkv/proj and MLP split column/row-wise (DTensor); "
               "hf: models by their base_model_tp_plan, else the harness's plan")
    phases = (Phase.TENSOR_PARALLEL,)
    Settings = TensorSettings
    requires = ("the gpt workload, or an hf: model with separate q/k/v projections (its own "
                "base_model_tp_plan, or the harness's plan: BERT, OPT ...; not GPT-2's fused "
                "c_attn); heads divisible by layout tensor")
    distributed = True

    def space(self):
        return {"mlp": Choice((True, False))}

    def check(self, settings, plan, env):
        t = plan.layout.tensor
        if plan.workload.startswith("hf:"):
            try:
                workload = load_workload(plan.workload, dict(plan.workload_args))
            except HarnessError as e:
                return [str(e)]
            need = [] if t >= 2 else ["tensor parallel needs layout tensor = 2 or more"]
            return need + hf_tensor.reasons(workload, t, settings.mlp)
        if plan.workload != "gpt":
            return [f"tensor parallel splits the built-in gpt workload only, not '{plan.workload}'"]
        try:
            cfg = from_table(GPTConfig, dict(plan.workload_args), "[workload]")
        except HarnessError as e:
            return [str(e)]
        reasons = []
        if t < 2:
            reasons.append("tensor parallel needs layout tensor = 2 or more")
        if cfg.heads % t:
            reasons.append(
                f"tensor parallel over {t} ranks needs heads ({cfg.heads}) divisible by {t}: "
                "each rank computes whole heads"
            )
        if cfg.hidden % t:
            reasons.append(
                f"tensor parallel over {t} ranks needs hidden ({cfg.hidden}) divisible by {t}"
            )
        return reasons

    def apply(self, phase, setup, settings):
        mesh = submesh(setup.mesh, "tensor", "tensor")
        if hasattr(getattr(setup.model, "config", None), "model_type"):  # a transformers model
            setup.notes.append(hf_tensor.apply(setup.model, mesh, settings.mlp))
            return
        blocks = getattr(setup.model, "blocks", None)
        if blocks is None:
            raise HarnessError("tensor: the model has no `blocks` of GPT blocks to split")
        plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel()}
        if settings.mlp:
            plan |= {"mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
        for block in blocks:
            interleave_qkv(block.qkv, mesh.size())
            parallelize_module(block, mesh, plan)
        setup.notes.append(
            f"tensor: {len(blocks)} blocks split over {mesh.size()} ranks "
            f"({'attention and MLP' if settings.mlp else 'attention only'})"
        )


register(Tensor())
