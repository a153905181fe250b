"""Backward's working set: the gradients alive while one op's backward runs.

An op's backward holds the gradient of its output and makes those of its
inputs, all alive at once (log-softmax's backward: the gradient nll_loss hands
it and the one it makes, two tensors of the logits' size, beside the output it
saved). Read off the autograd graph a trace leaves: each node's input metadata
is its outputs' gradients. Nodes that hand the gradient on as it is (a view, an
add, a clone) make nothing new, and a parameter's gradient is counted with the
gradients, not here.
"""

from __future__ import annotations

import math
from typing import Any

from training_harness.estimator.saved import Place

_PASS_ON = {
    "TBackward", "ViewBackward", "TransposeBackward", "PermuteBackward", "AliasBackward",
    "UnsafeViewBackward", "ReshapeAliasBackward", "AsStridedBackward", "AddBackward",
    "CloneBackward", "AccumulateGrad",
}


def _bytes(meta: Any) -> int:
    try:
        return math.prod(meta.shape) * meta.dtype.itemsize
    except (RuntimeError, TypeError, AttributeError):  # nested or symbolic: left out
        return 0


def node_working(node: Any) -> int:
    """Bytes of the gradients one node's backward receives and makes."""
    if type(node).__name__.rstrip("0123456789") in _PASS_ON:
        return 0
    received = sum(_bytes(m) for m in node._input_metadata)
    made = sum(
        _bytes(nxt._input_metadata[nr])
        for nxt, nr in node.next_functions
        if nxt is not None and type(nxt).__name__ != "AccumulateGrad"
    )
    return received + made


def working_by_place(
    places: dict[Any, Place], blocks: int
) -> tuple[int, dict[int, int], int]:
    """The largest working set outside the blocks before them, in each block, and
    after them (all of it `before` when there are no blocks)."""
    before = after = 0
    inside: dict[int, int] = {}
    for node, (block, done) in places.items():
        n = node_working(node)
        if block is not None:
            inside[block] = max(inside.get(block, 0), n)
        elif blocks and done == blocks:
            after = max(after, n)
        else:  # before the blocks, or between two
            before = max(before, n)
    return before, inside, after
