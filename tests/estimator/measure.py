"""Counting what torch really keeps on this CPU: the tensors autograd saves in a
forward pass, and the live bytes of a whole training step."""

from __future__ import annotations

import torch
from torch import nn


def saved_bytes(model: nn.Module, run, amp: bool) -> dict[str, int]:
    """Run forward for real, counting what autograd saves once per storage, by place."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    blocks = list(getattr(model, "blocks", []))
    current: list[int] = []

    def leave(_m: nn.Module, _args: object, _out: object) -> None:
        current.pop()

    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda _m, _a, i=i: current.append(i))
        block.register_forward_hook(leave)
    seen: dict[int, str] = {}
    sizes: dict[int, int] = {}
    held = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        held.append(t)
        key = t.untyped_storage().data_ptr()
        if key in params or key in seen:
            return t
        # autocast's copy of a parameter: a cast whose next node accumulates a leaf
        node = t.grad_fn
        while node is not None and type(node).__name__.startswith(("TBackward", "View")):
            node = node.next_functions[0][0]
        is_copy = (
            node is not None
            and type(node).__name__.startswith("ToCopyBackward")
            and isinstance(getattr(node.next_functions[0][0], "variable", None), nn.Parameter)
        )
        seen[key] = "copies" if is_copy else ("blocks" if current else "outside")
        sizes[key] = t.untyped_storage().nbytes()
        return t

    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
    ):
        run()
    out = {"copies": 0, "blocks": 0, "outside": 0}
    for key, where in seen.items():
        out[where] += sizes[key]
    return out


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak bytes of the storages created inside the mode that are still alive."""

    def __init__(self, exclude: set[int]) -> None:
        super().__init__()
        from torch.multiprocessing.reductions import StorageWeakRef

        self.ref, self.exclude, self.live, self.peak = StorageWeakRef, exclude, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live and key not in self.exclude:
                    self.live[key] = (self.ref(storage), storage.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out
