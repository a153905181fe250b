"""Any model's activations: trace one forward pass and add up what autograd saves."""

from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from training_harness.estimator.saved import SavedTensors, TraceOps, model_and_batch
from training_harness.estimator.settings import checkpointed_blocks
from training_harness.estimator.working import working_by_place
from training_harness.workloads.base import Workload


@dataclass
class Trace:
    """What one traced forward pass keeps for backward, in bytes."""

    activations: int  # saved by the blocks (by the whole model when it has none)
    other_activations: int  # saved outside the blocks (embedding, head, loss)
    other_before: int  # of which saved before the first block (the embedding's, a stem's)
    recompute: int  # the largest checkpointed block's own saved tensors, its input aside
    weight_copies: int  # autocast's 16-bit copies of parameters that backward needs
    weight_copies_kept: int  # of which saved outside checkpointed blocks
    weight_copies_rebuilt: int  # the largest checkpointed block's, made again when rebuilt
    weight_copies_by_block: list[int]  # of the kept ones, those each block keeps (the first
    # block to save one keeps it until its backward)
    head_working: int  # backward's working set in the ops after the blocks (head, loss)
    # ... in one block's ops, with the gradient of its output, which a residual
    # connection holds until the block's own is added: the largest block's (the whole
    # model's without blocks), and each block's
    block_working: int
    working_by_block: list[int]
    checkpointed: list[int]  # indices of the checkpointed blocks
    stored_by_block: list[int]  # bytes each block keeps (a checkpointed one: its input)
    recompute_flops: float  # forward FLOPs of the checkpointed blocks, per micro-batch
    calls_sdpa: bool  # whether the forward called scaled_dot_product_attention
    notes: list[str] = field(default_factory=list)


# The real-tensor fallback builds the model on the CPU: only below this many parameters.
REAL_TRACE_MAX_PARAMETERS = 200_000_000


class TraceFailed(Exception):
    """No way of tracing the workload worked; `line` says which op stopped it."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


def trace_activations(
    workload: Workload,
    micro_batch: int,
    amp: bool,
    device_type: str,
    checkpoint_every: int | None = None,
    fused_head: bool = False,
) -> Trace:
    """Trace `workload.loss` on fake tensors and add up what autograd saves.

    Saved tensors are counted once per storage (views share), leaving out
    parameters, buffers and autocast's weight copies (counted apart). Under amp
    the trace runs CPU autocast in bf16, with CUDA's fp32 norms and softmax
    emulated when `device_type` is 'cuda'. With checkpointing, a checkpointed
    block keeps only its inputs. `fused_head`: the model's head and loss are the fused
    linear cross-entropy (fused linear_cross_entropy), as the strategy swaps them in.

    A forward fake tensors cannot follow (one that makes a data-dependent decision)
    falls back, and says so in `notes`: to the meta device without autocast, then to
    one real sample on the CPU (a model of at most REAL_TRACE_MAX_PARAMETERS), its
    figures scaled by the micro-batch. Where none works, `TraceFailed` names the op
    that stopped it in one line.
    """
    key = (micro_batch, amp, device_type, checkpoint_every, fused_head)
    try:
        seen = _TRACES.setdefault(workload, {})
    except TypeError:  # a workload that cannot be a weak key: nothing kept
        seen = {}
    if key not in seen:
        try:
            seen[key] = _trace_activations(workload, micro_batch, amp, device_type,
                                           checkpoint_every, fused_head)
        except TraceFailed as e:
            seen[key] = e.line
    if isinstance(seen[key], str):
        raise TraceFailed(seen[key])
    return copy.deepcopy(seen[key])


# Traces per workload object (weakly) and the settings above, as the forward passes
# below: an estimate of the same workload and settings counts again nothing.
_TRACES: weakref.WeakKeyDictionary[Any, dict[tuple, Trace | str]] = weakref.WeakKeyDictionary()


def _trace_activations(workload: Workload, micro_batch: int, amp: bool, device_type: str,
                       checkpoint_every: int | None, fused_head: bool = False) -> Trace:
    from training_harness.estimator.fake_patches import fake_friendly, quiet_fake_errors

    try:
        with fake_friendly(), quiet_fake_errors():
            return _trace(workload, micro_batch, amp, device_type, checkpoint_every, fake=True,
                          fused_head=fused_head)
    except Exception as e:  # a workload fake tensors cannot run: meta, no autocast
        fake_error = e
    try:
        trace = _trace(workload, micro_batch, False, device_type, checkpoint_every, fake=False,
                       fused_head=fused_head)
        trace.notes.append(
            f"Could not trace on fake tensors ({stopped_by(fake_error)}); traced on the meta "
            "device without autocast, so 16-bit activations are counted at fp32 width."
        )
        return trace
    except Exception as e:
        meta_error = e
    too_big = _too_big_for_real(workload)
    if too_big:
        raise TraceFailed(f"{stopped_by(fake_error)}; {too_big}") from None
    try:
        with torch.random.fork_rng():  # the real initialisation draws from the global RNG
            one = _trace(workload, 1, amp, device_type, checkpoint_every, fake=None,
                         fused_head=fused_head)
    except Exception as e:
        raise TraceFailed(stopped_by(e)) from None
    trace = scaled(one, micro_batch)
    trace.notes.append(
        f"Fake tensors cannot follow this forward ({stopped_by(fake_error)}; on meta: "
        f"{stopped_by(meta_error)}); traced one real sample on the CPU and scaled its "
        f"activations by the micro-batch ({micro_batch})."
    )
    return trace


def stopped_by(e: BaseException) -> str:
    """One line: the error's first line and the last frame outside torch that raised it."""
    import traceback

    first = " ".join(str(e).strip().splitlines()[:1]) or type(e).__name__
    first = first if len(first) <= 160 else first[:157] + "..."
    where = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith("harness/estimator/saved.py"):
            continue
        tail = "/".join(path.split("/")[-2:])
        where = f" in {frame.name} ({tail}:{frame.lineno})"
        break
    return f"{type(e).__name__}: {first}{where}"


def _too_big_for_real(workload: Workload) -> str | None:
    with torch.device("meta"):
        n = sum(p.numel() for p in workload.build_model().parameters())
    if n > REAL_TRACE_MAX_PARAMETERS:
        return (f"{n / 1e6:.0f}M parameters are too many to trace for real on the CPU "
                f"(at most {REAL_TRACE_MAX_PARAMETERS / 1e6:.0f}M)")
    return None


def untraced(line: str) -> Trace:
    """No trace: activations counted as nothing, and the note that says why."""
    return Trace(0, 0, 0, 0, 0, 0, 0, [], 0, 0, [], [], [], 0.0, False, notes=[
        f"Activations are not predicted: no trace could follow the forward ({line}); the "
        "prediction counts the parameters, gradients and optimizer state only, and the "
        "trial's memory is what it measures."])


_PER_SAMPLE = ("activations", "other_activations", "other_before", "recompute", "head_working",
               "block_working", "recompute_flops")


def scaled(trace: Trace, micro_batch: int) -> Trace:
    """A trace of one sample as one of `micro_batch`: what the batch carries scales,
    the weight copies do not."""
    import dataclasses

    changes: dict = {k: getattr(trace, k) * micro_batch for k in _PER_SAMPLE}
    changes["working_by_block"] = [n * micro_batch for n in trace.working_by_block]
    changes["stored_by_block"] = [n * micro_batch for n in trace.stored_by_block]
    changes["notes"] = list(trace.notes)
    return dataclasses.replace(trace, **changes)


@dataclass
class _Forward:
    """One traced forward pass: what autograd saved, and the fake mode it ran in."""

    saved: SavedTensors
    mode: Any
    calls_sdpa: bool
    block_flops: dict[int, float | str] = field(default_factory=dict)  # str: why not


# Forward passes on fake tensors or the meta device, per workload object (weakly) and
# (micro-batch, amp, device type, fake): checkpointing changes only what is counted
# of them, so ranking a study's configurations (`harness plan`) traces an 8B model once
# per micro-batch size, not once per configuration. A failed one is kept as its error.
# Real CPU forwards (the last fallback) are not kept: they hold real tensors. The
# checkpointed blocks' recompute FLOPs are counted once per micro-batch size.
_FORWARDS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = (
    weakref.WeakKeyDictionary())


def _forward(workload: Workload, micro_batch: int, amp: bool, device_type: str,
             fake: bool | None, fused_head: bool = False) -> _Forward:
    key = (micro_batch, amp, device_type, fake, fused_head)
    try:
        seen = _FORWARDS.setdefault(workload, {}) if fake is not None else None
    except TypeError:  # a workload that cannot be a weak key: nothing kept
        seen = None
    if seen is None or key not in seen:
        try:
            made: _Forward | Exception = _run_forward(workload, micro_batch, amp, device_type,
                                                      fake, fused_head)
        except Exception as e:
            made = e
        if seen is None and isinstance(made, Exception):
            raise made
        if seen is None:
            assert isinstance(made, _Forward)
            return made
        if isinstance(made, _Forward):  # FLOPs count shapes: with or without autocast alike
            made.block_flops = seen.setdefault(("block_flops", micro_batch, fake), {})
        seen[key] = made
    hit = seen[key]
    if isinstance(hit, Exception):
        raise hit
    return hit


def _run_forward(workload: Workload, micro_batch: int, amp: bool, device_type: str,
                 fake: bool | None, fused_head: bool = False) -> _Forward:
    """On fake tensors (`fake`), the meta device (False) or real CPU ones (None)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode() if fake else None
    if fake is None:
        model = workload.build_model()
        batch = workload.batch(micro_batch, 0, "cpu")
    else:
        model, batch = model_and_batch(workload, micro_batch, mode)
    amp = amp and fake is not False  # no autocast on the meta device
    if fused_head:  # as the fused strategy swaps it in
        from training_harness.strategies.kernel_swaps import swap_linear_cross_entropy

        swap_linear_cross_entropy(model)
    model.train()
    saved = SavedTensors(model)
    handles = saved.hooked()
    ops = TraceOps(cuda_fp32=amp and device_type == "cuda")
    with contextlib.ExitStack() as stack:
        if mode is not None:
            stack.enter_context(mode)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t))
        stack.enter_context(ops)
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp))
        loss = workload.loss(model, batch)
        saved.held.append(loss)  # the graph, alive until we are done
        saved.tag(loss, (None, saved.done))
    for h in handles:
        h.remove()
    return _Forward(saved, mode, ops.calls_sdpa)


def _trace(
    workload: Workload,
    micro_batch: int,
    amp: bool,
    device_type: str,
    every: int | None,
    fake: bool | None,
    fused_head: bool = False,
) -> Trace:
    """On fake tensors (`fake`), the meta device (False) or real CPU ones (None)."""
    forward = _forward(workload, micro_batch, amp, device_type, fake, fused_head)
    saved = forward.saved
    blocks = saved.blocks
    ckpt = set(checkpointed_blocks(len(blocks), every))
    activations, other, before, by_block = _tally(saved, ckpt)
    stem_working, in_blocks, head_working = working_by_place(saved.places, saved.done)
    working = [
        in_blocks.get(i, 0) + saved.block_outputs.get(i, 0) for i in range(len(blocks))
    ]
    block_working = max(working) if saved.done else stem_working
    # A rebuilt block's own tensors; its input is kept already.
    inputs = saved.block_inputs
    per_block = {
        i: sum(n for key, (n, who) in saved.owners.items() if i in who and key not in inputs[i][2])
        for i in ckpt
    }
    notes: list[str] = []
    copies = saved.copies.values()
    return Trace(
        activations=activations,
        other_activations=other,
        other_before=before,
        recompute=max(per_block.values(), default=0),
        weight_copies=sum(n for n, _ in copies),
        weight_copies_kept=sum(n for n, who in copies if who - ckpt),
        weight_copies_rebuilt=max(
            (sum(n for n, who in copies if i in who) for i in ckpt), default=0
        ),
        weight_copies_by_block=_copies_by_block(saved, ckpt),
        head_working=head_working,
        block_working=block_working,
        working_by_block=working if saved.done else [],
        checkpointed=sorted(ckpt),
        stored_by_block=[by_block.get(i, 0) for i in range(len(blocks))],
        recompute_flops=_recompute_flops(forward, ckpt, notes),
        calls_sdpa=forward.calls_sdpa,
        notes=notes,
    )


def _tally(saved: SavedTensors, ckpt: set[int]) -> tuple[int, int, int, dict[int, int]]:
    """Bytes kept by the blocks, outside them, outside before them, and by the first
    block keeping them.

    A tensor saved only inside checkpointed blocks is not kept; a checkpointed
    block keeps its inputs instead.
    """
    activations = other = before = 0
    kept: set[int] = set()
    by_block: dict[int, int] = {}
    for key, (n, who) in saved.owners.items():
        live = who - ckpt
        if not live:
            continue  # saved only inside checkpointed blocks: not kept
        kept.add(key)
        in_blocks = sorted(o for o in live if o is not None)
        if not saved.blocks or in_blocks:
            activations += n
            if in_blocks:
                by_block[in_blocks[0]] = by_block.get(in_blocks[0], 0) + n
        else:
            other += n
            before += n if key in saved.before else 0
    for i in sorted(ckpt):
        for key, n in saved.block_inputs.get(i, ((), {}, {}))[2].items():
            if key not in kept and key not in saved.excluded:
                kept.add(key)
                activations += n
                by_block[i] = by_block.get(i, 0) + n
    return activations, other, before, by_block


def _copies_by_block(saved: SavedTensors, ckpt: set[int]) -> list[int]:
    """Autocast's weight copies kept by each block only (none outside the blocks)."""
    out = [0] * len(saved.blocks)
    for n, who in saved.copies.values():
        live = who - ckpt
        if live and None not in live:
            out[min(live)] += n
    return out


def _recompute_flops(forward: _Forward, ckpt: set[int], notes: list[str]) -> float:
    """Forward FLOPs of the checkpointed blocks, run again on their recorded inputs (each
    block counted once per forward pass, whatever is checkpointed)."""
    from torch.utils.flop_counter import FlopCounterMode

    saved, counted = forward.saved, forward.block_flops
    for i in sorted(ckpt - counted.keys()):
        try:
            with contextlib.ExitStack() as stack:
                if forward.mode is not None:
                    stack.enter_context(forward.mode)
                stack.enter_context(torch.no_grad())
                counter = stack.enter_context(FlopCounterMode(display=False))
                args, kwargs, _ = saved.block_inputs[i]
                saved.blocks[i](*args, **kwargs)
            counted[i] = float(counter.get_total_flops())
        except Exception as e:
            counted[i] = f"{type(e).__name__}: {e}"
    failed = [counted[i] for i in sorted(ckpt) if isinstance(counted[i], str)]
    if failed:
        notes.append(f"Recompute FLOPs not counted ({failed[0]}).")
        return 0.0
    return float(sum(counted[i] for i in ckpt))
