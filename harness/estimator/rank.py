"""One rank's memory: its parameters' state, its activations, the moments of its step.

Every rank of a data-parallel or tensor-parallel group holds the same (rank 0
the most where sizes do not divide, the fullest rank under ZeRO stage 1), so
the ranks that differ are the pipeline's: `rank_memory` takes a pipeline rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from training_harness.estimator.activations import ActivationParts, count_copies
from training_harness.estimator.facts import ModelFacts, Param
from training_harness.estimator.phases import step_phases
from training_harness.estimator.pipeline import in_flight, stage_activations
from training_harness.estimator.placement import rank_params, stage_blocks
from training_harness.estimator.result import COMPONENTS
from training_harness.estimator.settings import Settings
from training_harness.estimator.state import RankState, optimizer_temporaries, rank_state

# What stays all step: the peak is these plus the largest moment of a step.
PERSISTENT = ("parameters", "optimizer_state", "buffers", "gradient_buckets")


@dataclass
class RankMemory:
    memory: dict[str, int]
    phases: dict[str, int]
    peak: int
    state: RankState
    in_flight: list[int]  # micro-batches in flight per stage of this rank, at its peak
    grads_held: int


def rank_memory(
    parts: ActivationParts, facts: ModelFacts, cfg: Settings, device_type: str, rank: int = 0
) -> RankMemory:
    """Memory of pipeline rank `rank` (0 without a pipeline) from the model's
    activations for one micro-batch (`parts`).

    Gradients made by earlier micro-batches are alive while later ones run,
    unless this rank runs all its forwards before its first backward (GPipe, or
    1F1B with few micro-batches): then its peak is either every micro-batch in
    flight and no gradients yet, or one fewer and the gradients.
    """
    par = cfg.parallel
    layers = facts.blocks or 0
    params = rank_params(facts.params, layers, par, rank)
    state = rank_state(params, par, device_type, cfg.optimizer, cfg.averaging)
    chunks = stage_blocks(layers, par, rank)
    held = state.held
    if held is None:
        held = state.gradients if par.microbatches > 1 else 0
    counts = in_flight(par, rank)
    options = [(counts, held)]
    if par.pipeline > 1 and held and sum(counts) == par.microbatches * par.virtual:
        options = [(counts, 0), ([*counts[:-1], counts[-1] - 1], held)]
    found = [
        _moments(parts, facts, params, state, cfg, device_type, rank, chunks, n, h)
        for n, h in options
    ]
    return max(found, key=lambda r: r.peak)


def _moments(parts: ActivationParts, facts: ModelFacts, params: list[Param], state: RankState,
             cfg: Settings, device_type: str, rank: int, chunks: list[list[int]],
             counts: list[int], grads_held: int) -> RankMemory:
    """The rank's components and the moments of its step, `counts` micro-batches in
    flight per stage and `grads_held` bytes of gradients alive throughout."""
    par = cfg.parallel
    kept = 0
    if par.pipeline > 1:
        parts, kept = stage_activations(parts, par, rank, chunks, counts)
    else:
        parts = dataclasses.replace(parts, memory=dict(parts.memory))
    if par.fsdp_mixed:  # the gathered parameters are 16-bit already: autocast casts nothing
        parts.memory["autocast_weight_copies"] = 0
        parts.copies_kept, parts.copies_rebuilt, parts.block_copies = None, 0, []
    elif parts.copies_counted:  # this rank's parameters, as it holds them
        blocks = [sum(p.numel for p in params if p.block == i) for c in chunks for i in c]
        count_copies(parts, sum(p.numel for p in params), max(blocks, default=0),
                     len(parts.checkpointed))
    memory = dict.fromkeys(COMPONENTS, 0)
    memory.update(
        parameters=state.parameters,
        gradients=state.gradients,
        optimizer_state=state.optimizer_state,
        buffers=facts.buffer_bytes,
        optimizer_temporaries=optimizer_temporaries(state.optimizer_sizes, cfg, device_type),
        gathered_parameters=state.gathered,
        communication_buffers=state.communication,
        gradient_buckets=state.buckets,
    )
    memory.update(parts.memory)
    block_gradients = [state.block_gradients.get(i, 0) for c in chunks for i in c]
    phases = step_phases(memory, parts, grads_held, block_gradients, kept)
    peak = sum(memory[k] for k in PERSISTENT) + max(phases.values())
    return RankMemory(memory, phases, peak, state, counts, grads_held)
