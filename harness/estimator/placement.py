"""Which parameters one rank holds, and in which shape, under pipeline and tensor parallel.

Pipeline (strategies.pipeline): the blocks split evenly into `pipeline x virtual`
stages; pipeline rank r holds stages r, r + P, r + 2P, ... (the looped
placement); the first stage also holds what comes before the blocks
(embeddings), the last stage what comes after (final norm, head).

Tensor parallel (strategies.tensor, Megatron's split with DTensor): in each
block qkv and mlp.up are split by output rows (ColwiseParallel: weight and
bias), proj and mlp.down by input columns (RowwiseParallel: the weight; the
bias stays whole). Norms, embeddings and the head stay whole. Tensor rank 0
holds the largest share when a size does not divide.
"""

from __future__ import annotations

import dataclasses
import math

from training_harness.estimator.facts import Param
from training_harness.estimator.settings import Parallelism

COLWISE = ("qkv", "mlp.up")  # the layers strategies.tensor splits by output rows
ROWWISE = ("proj", "mlp.down")  # by input columns
MLP_LAYERS = ("mlp.up", "mlp.down")


def stage_blocks(layers: int, par: Parallelism, rank: int) -> list[list[int]]:
    """The blocks of each stage pipeline rank `rank` holds, in its stage order."""
    total = par.pipeline * par.virtual
    per = math.ceil(layers / total)
    return [
        list(range(s * per, min((s + 1) * per, layers)))
        for s in range(rank, total, par.pipeline)
    ]


def tensor_shape(p: Param, ranks: int, mlp: bool) -> tuple[int, ...]:
    """`p`'s shape on tensor rank 0."""
    if ranks == 1 or p.block is None or not p.shape:
        return p.shape
    layer, _, kind = p.name.split(".", 2)[2].rpartition(".")  # blocks.0.mlp.up.weight
    if layer in MLP_LAYERS and not mlp:
        return p.shape
    if layer in COLWISE:
        return (math.ceil(p.shape[0] / ranks), *p.shape[1:])
    if layer in ROWWISE and kind == "weight" and len(p.shape) == 2:
        return (p.shape[0], math.ceil(p.shape[1] / ranks))
    return p.shape


def rank_params(params: tuple[Param, ...], layers: int, par: Parallelism, rank: int) -> list[Param]:
    """The parameters pipeline rank `rank` (tensor rank 0) holds, in their local shapes."""
    blocks = {i for stage in stage_blocks(layers, par, rank) for i in stage}
    first, last = rank == 0, rank == par.pipeline - 1
    out = []
    for p in params:
        if par.pipeline > 1 and not (
            (p.block in blocks) if p.block is not None else (first if p.first else last)
        ):
            continue
        out.append(dataclasses.replace(p, shape=tensor_shape(p, par.tensor, par.tensor_mlp)))
    return out
