"""The tools of a trace: the model on fake tensors, and a record of what autograd saves."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from training_harness.workloads.base import Workload
from training_harness.workloads.blocks import find_blocks

_VIEW_NODES = {
    "TBackward", "ViewBackward", "TransposeBackward", "PermuteBackward",
    "ExpandBackward", "AliasBackward", "UnsafeViewBackward", "SliceBackward",
    "SelectBackward", "ReshapeAliasBackward", "AsStridedBackward",
}


def is_parameter_copy(t: torch.Tensor, param_ids: set[int]) -> bool:
    """Whether `t` is (a view of) a dtype cast of a parameter: autocast's weight copy."""
    node = t.grad_fn
    for _ in range(8):
        if node is None:
            return False
        name = type(node).__name__.rstrip("0123456789")
        if name == "ToCopyBackward":
            nxt = node.next_functions[0][0] if node.next_functions else None
            return id(getattr(nxt, "variable", None)) in param_ids
        if name not in _VIEW_NODES or not node.next_functions:
            return False
        node = node.next_functions[0][0]
    return False


# Where forward made an autograd node: (i, blocks finished) inside block i,
# (None, blocks finished) outside the blocks.
Place = tuple[int | None, int]


def _bytes(t: Any) -> int:
    return math.prod(t.shape) * t.dtype.itemsize


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            yield leaf


class TraceOps(torch.overrides.TorchFunctionMode):
    """Notes calls to scaled_dot_product_attention; with `cuda_fp32`, runs CUDA
    autocast's fp32 ops in fp32.

    The trace runs under CPU autocast (fake tensors cannot be CUDA ones here);
    CUDA autocast runs norms and softmax in fp32, which CPU autocast leaves in
    bf16: their input becomes an fp32 copy (which they keep) and their output
    fp32. Casting their input here reproduces that.
    """

    def __init__(self, cuda_fp32: bool) -> None:
        super().__init__()
        self.calls_sdpa = False
        f = torch.nn.functional
        self.sdpa = f.scaled_dot_product_attention
        self.ops: set[Callable[..., Any]] = set()
        if cuda_fp32:
            names = ("layer_norm", "group_norm", "rms_norm", "softmax", "log_softmax", "softplus")
            self.ops = {getattr(f, n) for n in names if hasattr(f, n)}
            self.ops |= {torch.softmax, torch.log_softmax, torch.layer_norm, torch.group_norm}
            self.ops |= {torch.Tensor.softmax, torch.Tensor.log_softmax}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is self.sdpa:
            self.calls_sdpa = True
        if (
            func in self.ops
            and args
            and isinstance(args[0], torch.Tensor)
            and args[0].dtype in (torch.bfloat16, torch.float16)
        ):
            args = (args[0].float(), *args[1:])
        return func(*args, **kwargs)


def fake_model(workload: Workload, mode: Any) -> nn.Module:
    """The workload's model with fake CPU parameters and buffers.

    Built under the fake mode directly; a model whose initialisation reads
    values (trunc_normal_ does) is built on the meta device and given empty fake
    tensors instead, ties kept.
    """
    try:
        with mode:
            return workload.build_model()
    except Exception:
        with torch.device("meta"):
            model = workload.build_model()
        made: dict[int, torch.Tensor] = {}
        with mode:
            for module in model.modules():
                for table, as_param in ((module._parameters, True), (module._buffers, False)):
                    for name, t in list(table.items()):
                        if t is None:
                            continue
                        if id(t) not in made:
                            empty = torch.empty(t.shape, dtype=t.dtype)
                            made[id(t)] = (
                                nn.Parameter(empty, requires_grad=t.requires_grad)
                                if as_param
                                else empty
                            )
                        table[name] = made[id(t)]
        return model


def model_and_batch(workload: Workload, micro_batch: int, mode: Any) -> tuple[nn.Module, Any]:
    """The model and one micro-batch on fake tensors (`mode`), or on the meta device."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._pytree import tree_map

    if mode is None:
        with torch.device("meta"):
            return workload.build_model(), workload.batch(micro_batch, 0, "meta")
    model = fake_model(workload, mode)
    if (batch := _fake_from_real(workload, micro_batch, mode)) is not None:
        return model, batch
    try:
        with mode:
            batch = workload.batch(micro_batch, 0, "cpu")
    except Exception:  # a batch source fake tensors cannot run: make it for real
        with unset_fake_temporarily():
            real = workload.batch(micro_batch, 0, "cpu")
        batch = tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, real)
    return model, batch


# A batch at most this large is drawn for real, then made fake (below).
REAL_BATCH_MAX_BYTES = 1024**3


def _fake_from_real(workload: Workload, micro_batch: int, mode: Any) -> Any:
    """The batch drawn for real on the CPU and made fake (views keep sharing their
    storage, as in the trial); None when its meta batch says it is larger than
    REAL_BATCH_MAX_BYTES, or the workload makes none on the meta device. Drawing a batch
    on fake tensors instead runs its drawing op by op through the fake mode (a
    4,096-token sequence drawn token by token took 2 of an 8B Llama's 3 minutes of
    `harness estimate`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._pytree import tree_leaves, tree_map

    try:
        meta = workload.batch(micro_batch, 0, "meta")
    except Exception:
        return None
    leaves = [x for x in tree_leaves(meta) if isinstance(x, torch.Tensor)]
    if not leaves or sum(x.nbytes for x in leaves) > REAL_BATCH_MAX_BYTES:
        return None
    with unset_fake_temporarily():
        real = workload.batch(micro_batch, 0, "cpu")
    return tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, real)


class SavedTensors:
    """What autograd saves in a forward pass, by storage, and which block saved it.

    `owners` and `copies` (autocast's weight copies) map a storage to its bytes
    and the blocks that saved it (None: outside the blocks); parameters and
    buffers are left out; `before` holds the storages saved outside the blocks
    before the first one ran. `block_inputs` keeps each block's first inputs and
    their storages' sizes. `places` maps each autograd node to where forward
    made it (`tag`); `block_outputs` each block's output bytes. Use `pack` as the
    saved-tensors hook, inside `hooked`.
    """

    def __init__(self, model: nn.Module) -> None:
        params = list(model.parameters())
        self.param_ids = {id(p) for p in params}
        self.excluded = {storage_key(p) for p in params}
        self.excluded |= {storage_key(b) for b in model.buffers()}
        # `model.blocks`, or the repeated layers found (HF decoder layers, torchvision stages)
        self.blocks: list[nn.Module] = list(find_blocks(model) or [])
        self.current: list[int] = []
        self.block_inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any], dict[int, int]]] = {}
        self.held: list[torch.Tensor] = []  # keeps storages alive so their keys stay unique
        self.owners: dict[int, tuple[int, set[int | None]]] = {}  # storage -> (bytes, savers)
        self.copies: dict[int, tuple[int, set[int | None]]] = {}
        self.before: set[int] = set()
        self.done = 0  # blocks finished so far
        self.places: dict[Any, Place] = {}
        self.block_outputs: dict[int, int] = {}

    def tag(self, roots: Any, place: Place) -> None:
        """Give `place` to the autograd nodes behind `roots` that have none yet:
        forward runs in order, so those are the ones made since the last tag."""
        stack = [t.grad_fn for t in tensors(roots) if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node in self.places:
                continue
            self.places[node] = place
            stack.extend(n for n, _ in node.next_functions if n is not None)

    def hooked(self) -> list[Any]:
        """Register the hooks that follow which block runs; returns their handles."""
        handles = []
        for i, block in enumerate(self.blocks):

            def pre(_m: nn.Module, args: Any, kwargs: Any, i: int = i) -> None:
                self.tag((args, kwargs), (None, self.done))  # made outside, before block i
                self.current.append(i)
                sizes = {
                    storage_key(x): x.untyped_storage().nbytes() for x in tensors((args, kwargs))
                }
                self.block_inputs.setdefault(i, (args, kwargs, sizes))

            def post(_m: nn.Module, _args: Any, out: Any, i: int = i) -> None:
                self.current.pop()
                self.tag(out, (i, self.done))
                self.done += 1
                self.block_outputs.setdefault(i, sum(_bytes(t) for t in tensors(out)))

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(block.register_forward_hook(post))
        return handles

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.held.append(t)
        key = storage_key(t)
        if key in self.excluded:
            return t
        table = (
            self.copies
            if key in self.copies or is_parameter_copy(t, self.param_ids)
            else self.owners
        )
        entry = table.setdefault(key, (t.untyped_storage().nbytes(), set()))
        entry[1].add(self.current[-1] if self.current else None)
        if not self.current and not self.done:
            self.before.add(key)
        return t
