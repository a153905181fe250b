"""Parameter counts of the GPT workload (training_harness.workloads.gpt) per rank: tensor
parallel splits the blocks' linears (not the norms, the embeddings or the head),
pipeline parallel gives each stage its share of the blocks, the first stage the
embeddings and the last the final norm and the head."""

from __future__ import annotations

from dataclasses import dataclass

from tests.benchmarks.surfaces.config import Config


@dataclass(frozen=True)
class Stage:
    index: int
    layers: int
    first: bool
    last: bool
    params: float  # parameters held on one rank of this stage
    tensors: int  # parameter tensors on it (what an optimizer loops over)


def layer_params(c: Config) -> float:
    """One block's parameters on one tensor-parallel rank."""
    h, f, t = c.hidden, c.ffn, c.tensor
    linears = (4 + 2 * f) * h * h + (5 + f) * h  # qkv, proj, up, down: weights + biases
    return linears / t + 4 * h  # two LayerNorms, replicated


def total_params(c: Config) -> float:
    h = c.hidden
    heads = 0 if c.tied else c.vocab * h
    return c.layers * (layer_params(c) * c.tensor) + c.vocab * h + c.seq * h + heads + 2 * h


def stages(c: Config) -> list[Stage]:
    p = c.pipeline
    per = [c.layers // p + (1 if i < c.layers % p else 0) for i in range(p)]
    out = []
    for i, n in enumerate(per):
        first, last = i == 0, i == p - 1
        params = n * layer_params(c)
        tensors = 12 * n
        if first:
            params += (c.vocab + c.seq) * c.hidden
            tensors += 2
        if last:
            params += 2 * c.hidden + (0 if c.tied and p == 1 else c.vocab * c.hidden)
            tensors += 2 + (0 if c.tied and p == 1 else 1)
        out.append(Stage(i, n, first, last, params, tensors))
    return out
