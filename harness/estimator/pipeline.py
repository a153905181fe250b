"""Pipeline parallel: the bubble, the micro-batches in flight, one stage's activations.

p pipeline ranks, v stages per rank (virtual stages), m micro-batches per step.

Bubble: the fraction of a step a rank idles, (p − 1) / (m + p − 1) for GPipe
and 1F1B (Narayanan et al. 2021: p − 1 micro-batch times of fill and drain
against m of work); the interleaved schedule shortens fill and drain to
(p − 1)/v of them: (p − 1) / (v·m + p − 1).

In flight at a rank's peak, as torch.distributed.pipelining schedules them:
GPipe runs all m forwards first, so every stage holds m micro-batches; 1F1B
warms up with min(m, p − r) forwards on rank r and then alternates one
backward, one forward: rank 0 holds the most, min(m, p); the interleaved
schedule warms up with (v − 1)·(micro-batches per round) + 2·(p − 1 − r)
forwards, then does one more forward before its first backward, each forward
being one of the rank's v stages for one micro-batch.
"""

from __future__ import annotations

import dataclasses

from training_harness.estimator.activations import ActivationParts
from training_harness.estimator.settings import Parallelism


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """(p − 1) / (v·m + p − 1): the share of a step a pipeline rank idles."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (virtual * microbatches + stages - 1)


def in_flight(par: Parallelism, rank: int) -> list[int]:
    """Micro-batches each of pipeline rank `rank`'s stages holds at its peak."""
    p, v, m = par.pipeline, par.virtual, par.microbatches
    if p == 1:
        return [1]
    if par.schedule == "gpipe":
        return [m] * v
    if par.schedule == "1f1b" or v == 1:
        return [min(m, p - rank)] * v
    per_round = m // max(1, m // p)
    forwards = min((v - 1) * per_round + 2 * (p - 1 - rank) + 1, m * v)
    counts = [0] * v
    for op in range(forwards):
        counts[(op // per_round) % v] += 1
    return counts


def stage_activations(
    parts: ActivationParts, par: Parallelism, rank: int, chunks: list[list[int]], counts: list[int]
) -> tuple[ActivationParts, int]:
    """Pipeline rank `rank`'s activations (its stages `chunks`, blocks by stage) with
    `counts` micro-batches in flight per stage, and what of its pipeline_buffers lives
    to the step's end.

    torch's stages keep a receive buffer per micro-batch for their input (all but
    the first stage) and for their output's gradient (all but the last), made
    once and kept; an input in flight is the first block's saved input already.
    Each stage also keeps its output per micro-batch in flight, for backward. The
    last stage's outputs (the logits) are not kept past their loss: the pipeline
    strategy asks the schedule not to return them.
    """
    p, m = par.pipeline, par.microbatches
    first, last = rank == 0, rank == p - 1
    blocks = [i for chunk in chunks for i in chunk]
    stored = [parts.stored[i] * n for chunk, n in zip(chunks, counts, strict=True) for i in chunk]
    memory = dict(parts.memory)
    memory["activations"] = sum(stored)
    outside_last = memory["other_activations"] - parts.outside_first
    memory["other_activations"] = (
        (parts.outside_first * counts[0] if first else 0)
        # the loss keeps its log-softmax output until that micro-batch's backward
        + ((outside_last + parts.loss_saved) * counts[-1] - parts.loss_saved if last else 0)
    )
    if not last:
        memory["logits"] = 0
    buffers = outputs = 0
    for c, n in enumerate(counts):
        stage = c * p + rank
        buffers += 0 if stage == 0 else m - n  # input buffers, beyond those in flight
        if stage != p * par.virtual - 1:
            buffers, outputs = buffers + m, outputs + n  # gradient buffers; outputs
    # strategies.pipeline steps with return_outputs=False: the last stage keeps no
    # per-micro-batch logits and merges none at the end (torch would, by default).
    kept = parts.stage_output * buffers
    memory["pipeline_buffers"] = kept + parts.stage_output * outputs
    ckpt = [j for j, i in enumerate(blocks) if i in parts.checkpointed]
    if not ckpt:
        memory["recompute"] = 0
    stage = dataclasses.replace(
        parts,
        memory=memory,
        stored=stored,
        checkpointed=ckpt,
        outside_first=parts.outside_first * counts[0] if first else 0,
        block_copies=[],  # all of the stage's copies counted through backward
        block_working=[parts.block_working[i] for i in blocks] if parts.block_working else [],
        loss_forward=parts.loss_forward if last else 0,
    )
    return stage, kept
