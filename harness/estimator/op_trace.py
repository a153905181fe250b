"""A training step's operators, traced on fake tensors: what the profile costs one by one.

The plan's model is built and its strategies composed on fake tensors (nothing is
allocated or computed), and one step's forward and backward run under a dispatch mode
that notes each ATen operator: a matmul by its (m, n, k) and dtype, attention by its
rows and length, any other operator by the bytes it reads and writes and its kind.
Checkpointing's recompute, autocast's casts and the kernels the fused strategy swaps in
are traced as they run. The optimizer's step is not traced (its state needs real step
counts): training_harness.estimator.profiled_step costs it from the profile's optimizer
figures.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten


@dataclass(frozen=True)
class Op:
    """Operators of one kind and shape, `count` times. `kind`: "matmul" (a GEMM of (m, n, k)
    in elements of `itemsize` bytes), "convolution" (forward) or "convolution_backward_"
    + the gradients it computes ("input", "weight" or "input_weight"), each by its
    forward's GEMM (m, n, k), "attention_forward" / "attention_backward" (m rows of
    batch x heads, length n, head dim k), "view" (no data moved), or an elementwise kind of
    the profile (training_harness.measure.device_profile.ELEMENTWISE) moving `bytes`."""

    kind: str
    m: int = 0
    n: int = 0
    k: int = 0
    itemsize: int = 4
    bytes: int = 0
    causal: bool = True
    count: int = 1


MATMULS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
CONVOLUTIONS = {aten.convolution, aten.convolution_backward}
SDPA_FORWARD = {"_scaled_dot_product_flash_attention_for_cpu",
                "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_cudnn_attention"}
TRANSCENDENTAL = ("gelu", "tanh", "exp", "sigmoid", "silu", "erf", "log", "pow", "rsqrt",
                  "sqrt", "sin", "cos")
NORM = ("layer_norm", "rms_norm", "group_norm")
SOFTMAX = ("softmax", "log_softmax")
REDUCTION = ("sum", "mean", "amax", "max", "min", "nll_loss", "norm", "var", "std")


def elementwise_kind(name: str) -> str:
    """The profile's kind for an operator's name (the overload packet's)."""
    base = name.lstrip("_").removesuffix("_")
    if "batch_norm" in base:
        return "batch_norm"
    if any(w in base for w in NORM):
        return "norm"
    if any(w in base for w in SOFTMAX):
        return "softmax"
    if any(base.startswith(w) for w in TRANSCENDENTAL):
        return "transcendental"
    if any(base.startswith(w) for w in REDUCTION):
        return "reduction"
    return "binary"


class OpRecorder(TorchDispatchMode):
    """Notes each operator (see `Op`); its results come from the modes below it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[Op] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self.ops[describe(func, args, kwargs, out)] += 1
        except Exception:  # an operator of a shape this does not read: a plain one
            self.ops[Op("binary", bytes=_bytes(args) + _bytes(out))] += 1
        return out


def describe(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Op:
    packet = getattr(func, "overloadpacket", func)  # a higher-order op has none
    name = getattr(packet, "__name__", str(packet))
    if func.is_view or name in ("detach", "alias", "lift_fresh", "_unsafe_view"):
        return Op("view")
    if packet in MATMULS:
        a, b = (args[1], args[2]) if packet in (aten.addmm, aten.baddbmm) else args[:2]
        batch = a.shape[0] if a.dim() == 3 else 1
        return Op("matmul", batch * a.shape[-2], b.shape[-1], a.shape[-1], a.dtype.itemsize)
    if packet in CONVOLUTIONS:
        return _convolution(packet, args, out)
    if name in SDPA_FORWARD or name.removesuffix("_backward") in SDPA_FORWARD:
        q = args[0] if name in SDPA_FORWARD else args[1]
        b, h, s, d = q.shape
        causal = _is_causal(func, args, kwargs)
        kind = "attention_forward" if name in SDPA_FORWARD else "attention_backward"
        return Op(kind, b * h, s, d, q.dtype.itemsize, causal=causal)
    return Op(elementwise_kind(name), itemsize=_itemsize(out), bytes=_bytes(args) + _bytes(out))


def _is_causal(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """The operator's is_causal, by its schema: positional or not, and False where left
    out (every SDPA kernel's default; the first bool among the arguments is another one
    in some, such as compute_log_sumexp)."""
    from torch.fx.operator_schemas import normalize_function

    named = normalize_function(func, tuple(args), kwargs, normalize_to_only_use_kwargs=True)
    return bool(named.kwargs.get("is_causal", False)) if named else False


def _convolution(packet: Any, args: Any, out: Any) -> Op:
    """A convolution by its GEMM: m = batch x output positions, n = output channels,
    k = input channels per group x kernel size; backward by the same GEMM and the
    gradients it computes (those asked for: the input's, the weight's)."""
    if packet is aten.convolution:
        y, w, kind = out, args[1], "convolution"
    else:
        y, w, mask = args[0], args[2], args[-1]
        kind = "convolution_backward_" + "_".join(
            g for g, asked in (("input", mask[0]), ("weight", mask[1])) if asked)
    m = y.shape[0] * math.prod(y.shape[2:])
    return Op(kind, m, w.shape[0], math.prod(w.shape[1:]), args[1].dtype.itemsize)


def _itemsize(out: Any) -> int:
    """The width of the operator's (first) output: its kernel's element type."""
    first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
    return first.element_size() if first is not None else 4


def _bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(obj)
               if isinstance(t, torch.Tensor))


def trace_callable(fn: Callable[[], Any]) -> list[Op]:
    """The operators `fn` runs (on whatever tensors it uses), counted by kind and shape."""
    recorder = OpRecorder()
    with recorder:
        fn()
    return [Op(**{**op.__dict__, "count": n}) for op, n in recorder.ops.items()]


class StepTraceFailed(Exception):
    """The step could not be traced on fake tensors; the message says which op stopped it."""


def trace_step(plan: Any, workload: Any, micro_batch: int) -> list[Op]:
    """One micro-step's forward and backward operators of `plan` on `workload`, with its
    single-device strategies composed on fake CPU tensors (amp's autocast, checkpoint
    wrappers, the fused strategy's swaps). torch.compile is left out: it is costed by
    the caller. StepTraceFailed where fake tensors cannot run it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from training_harness.core.device import RuntimeEnv
    from training_harness.estimator.fake_patches import fake_friendly, quiet_fake_errors
    from training_harness.estimator.saved import model_and_batch
    from training_harness.strategies.compose import compose

    strategies = {k: dict(v) for k, v in plan.strategies.items()}
    if "fused" in strategies:
        strategies["fused"] = {**strategies["fused"], "compile": False,
                               "compile_mode": "default"}
    traced = plan.replace(strategies=strategies, device="cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with fake_friendly(), quiet_fake_errors():
            model, batch = model_and_batch(workload, micro_batch, mode)
            setup = compose(model, traced, "cpu", RuntimeEnv.detect("cpu"))
            with mode:
                recorder = OpRecorder()
                with recorder:
                    with setup.autocast():
                        loss = workload.loss(setup.model, batch)
                    loss.backward()
    except Exception as e:  # noqa: BLE001 - any op fake tensors cannot run
        raise StepTraceFailed(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
    return [Op(**{**op.__dict__, "count": n}) for op, n in recorder.ops.items()]
