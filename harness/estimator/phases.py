"""The moments of a step: what lives above the persistent state at each, and the peak."""

from __future__ import annotations

from harness.estimator.activations import ActivationParts


def rebuild_moment(
    stored: list[int], params: list[int], checkpointed: list[int], trainable: int, held: int
) -> int:
    """Activations and gradients alive when a checkpointed block is rebuilt, at most.

    Backward runs the blocks last to first. When it rebuilds checkpointed block
    j, the blocks after j are done (their activations freed, their gradients
    made, and j's own come in its backward), the blocks up to j still keep
    theirs (`stored`). Early blocks see more gradients, late ones more
    activations: the largest over j counts. `held`: gradients kept from earlier
    micro-steps.
    """
    return max(
        (
            sum(stored[: j + 1]) + max(held, trainable - sum(params[:j]))
            for j in checkpointed
        ),
        default=0,
    )


def step_phases(
    memory: dict[str, int],
    parts: ActivationParts,
    grads_held: int,
    block_gradients: list[int],
    through_step: int = 0,
    merged: int = 0,
) -> dict[str, int]:
    """What lives above the persistent state (parameters, optimizer state, buffers,
    gradient buckets) at each moment of a step.

    Gradients are None at the start of backward (the step zeroes them with
    set_to_none=True) unless earlier micro-steps made them or DDP's buckets hold
    them (`grads_held`); `block_gradients` are each block's, made in its
    backward. The loss's transient comes first in backward and is gone before
    any block's. FSDP's gathered parameters and a pipeline's buffers live
    through forward and backward, unreduced gradients through backward.
    `through_step`: of the pipeline's buffers, those still alive at the optimizer
    step (its receive buffers, the last stage's logits); `merged`: the logits
    the last stage merges (one more copy) when the schedule ends.
    """
    copies = memory["autocast_weight_copies"]
    kept = copies if parts.copies_kept is None else parts.copies_kept
    comm = memory["communication_buffers"]
    saved = (
        memory["activations"]
        + memory["other_activations"]
        + grads_held
        + memory["gathered_parameters"]
        + memory["pipeline_buffers"]
    )
    phases = {
        "forward_end": copies + saved + parts.loss_forward,
        "backward_start": kept + saved + max(memory["logits"], memory["backward_working"] + comm),
    }
    if memory["recompute"]:
        phases["checkpoint_recompute"] = (
            kept
            + parts.copies_rebuilt
            + memory["other_activations"]
            + memory["gathered_parameters"]
            + memory["pipeline_buffers"]
            + memory["recompute"]
            + memory["backward_working"]
            + comm
            + rebuild_moment(
                parts.stored,
                block_gradients,
                parts.checkpointed,
                memory["gradients"],
                grads_held,
            )
        )
    if merged:
        phases["pipeline_merge"] = memory["gradients"] + through_step + merged
    phases["optimizer_step"] = (
        memory["gradients"] + memory["optimizer_temporaries"] + through_step
    )
    return phases
