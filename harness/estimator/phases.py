"""The moments of a step: what lives above the persistent state at each, and the peak."""

from __future__ import annotations

from training_harness.estimator.activations import ActivationParts


def blocks_moment(
    stored: list[int],
    params: list[int],
    checkpointed: list[int],
    rebuilt: int,
    trainable: int,
    held: int,
    working: list[int] | None = None,
) -> int:
    """Activations and gradients alive while backward runs through a block, at most.

    Backward runs the blocks last to first. In block j's backward the blocks
    after j are done (their activations freed, their gradients made, and j's
    own come now), the blocks up to j still keep theirs (`stored`); a
    checkpointed block j is rebuilt first, its tensors (`rebuilt`) made again.
    Early blocks see more gradients, late ones more activations: the largest
    over j counts. The gradients outside the blocks are counted as made already
    (those of the layers before the blocks come last: an upper bound). `held`:
    gradients kept from earlier micro-steps; `working`: each block's backward
    working set. Within block j all of this is counted at once, though its own
    tensors are freed as its gradients come: an upper bound.
    """
    ckpt = set(checkpointed)
    return max(
        (
            sum(stored[: j + 1])
            + (rebuilt if j in ckpt else 0)
            + max(held, trainable - sum(params[:j]))
            + (working[j] if working else 0)
            for j in range(len(stored))
        ),
        default=0,
    )


def step_phases(
    memory: dict[str, int],
    parts: ActivationParts,
    grads_held: int,
    block_gradients: list[int],
    through_step: int = 0,
) -> dict[str, int]:
    """What lives above the persistent state (parameters, optimizer state, buffers,
    gradient buckets) at each moment of a step.

    Gradients are None at the start of backward (the step zeroes them with
    set_to_none=True) unless earlier micro-steps made them or DDP's buckets hold
    them (`grads_held`); `block_gradients` are each block's, made in its
    backward. The loss's transient comes first in backward and is gone before
    any block's, and so is what the head and loss saved. FSDP's gathered
    parameters and a pipeline's buffers live through forward and backward,
    unreduced gradients through backward.
    `through_step`: of the pipeline's buffers, those still alive at the optimizer
    step (its receive buffers).
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
        # A model with blocks meets their working sets in `backward_blocks`.
        "backward_start": kept + saved + max(
            memory["logits"], (0 if parts.stored else memory["backward_working"]) + comm
        ),
    }
    if parts.stored:
        # In a block's backward the head and loss are done: of what was saved outside
        # the blocks only what came before them is kept; of autocast's copies, those
        # of the blocks done are freed.
        block_copies = parts.block_copies or [0] * len(parts.stored)
        phases["backward_blocks"] = (
            kept
            - sum(block_copies)
            + parts.outside_first
            + memory["gathered_parameters"]
            + memory["pipeline_buffers"]
            + comm
            + blocks_moment(
                [n + c for n, c in zip(parts.stored, block_copies, strict=True)],
                block_gradients,
                parts.checkpointed,
                memory["recompute"] + parts.copies_rebuilt,
                memory["gradients"],
                grads_held,
                parts.block_working or [memory["backward_working"]] * len(parts.stored),
            )
        )
    phases["optimizer_step"] = (
        memory["gradients"] + memory["optimizer_temporaries"] + through_step
    )
    return phases
