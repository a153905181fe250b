"""Predicted peak memory and step time of a plan, without running it.

`estimate(plan, workload, env, peak_flops)` works out, per device:

- parameters, gradients and optimizer state, from the parameter count of the
  model built on the meta device (tied weights once);
- activations: for transformers (`workload.shape` set) term by term after
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1, adapted to what PyTorch actually saves (see
  `block_activation_terms`); for other models by tracing one forward pass on
  fake tensors and adding up what autograd saves (`trace_activations`);
- the transient of the language-model loss, the 16-bit weight copies autocast
  keeps, the working set of a block's backward, under activation checkpointing
  the one block rebuilt at a time, and the optimizer step's temporaries.

These do not all live at once. The peak is the persistent state (parameters,
optimizer state, buffers) plus the largest of the moments of a step
(`Estimate.phases`): the end of forward, the start of backward (activations and
the loss's transient, no gradients yet: the step zeroes them with
`set_to_none=True`), the rebuild of a checkpointed block, and the
optimizer step (gradients and temporaries, the activations gone). The plain sum
of all components is kept as an upper bound (`Estimate.upper_bound_bytes`).

Step time is the step's FLOPs over an assumed fraction of the device's peak.
Every figure comes with sentences that state what it assumes
(`Estimate.assumptions`): the estimate is meant to be checked against
measurements, and those sentences say where it can be wrong.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.device import RuntimeEnv
from harness.plan import Layout, Plan
from harness.units import format_bytes
from harness.workloads.base import TransformerShape, Workload

# Assumed fraction of the peak FLOP rate a training step reaches. On CUDA the
# peak is the datasheet (or calibration-matmul) figure; on CPU it is a measured
# matmul peak, which a whole training step gets closer to.
ASSUMED_MFU = {"cuda": 0.4, "cpu": 0.5}

# The components of `Estimate.memory`, in the order they are shown.
COMPONENTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "buffers",
    "autocast_weight_copies",
    "activations",
    "other_activations",
    "logits",
    "backward_working",
    "recompute",
    "optimizer_temporaries",
)


@dataclass
class Estimate:
    """Predicted per-device peak memory and step time of one plan.

    `memory` holds bytes per component (all of `COMPONENTS`, zero where one does
    not apply): parameters, gradients, optimizer_state, buffers;
    autocast_weight_copies (the 16-bit weight copies autocast makes in forward);
    activations (what the repeated blocks keep for backward, or the whole
    model's when it has no blocks); other_activations (what the rest keeps:
    token ids, embeddings, final norm, head input, loss); logits (the
    language-model loss's transient at the start of backward);
    backward_working (the most one block's or op's backward holds beyond what
    it saved); recompute (one checkpointed block's activations, rebuilt in
    backward); optimizer_temporaries (the optimizer step's scratch memory).

    `phases` gives what lives above the persistent state at each moment of a
    step; the peak is the persistent state (parameters, optimizer_state,
    buffers) plus the largest phase. `upper_bound_bytes` sums every component.
    """

    peak_memory_bytes: int
    step_time_s: float | None
    memory: dict[str, int]
    flops_per_step: float
    assumptions: list[str]
    phases: dict[str, int] = field(default_factory=dict)
    upper_bound_bytes: int = 0
    # Bytes of one transformer block's saved tensors, by term (empty when traced).
    block_terms: dict[str, int] = field(default_factory=dict)
    assumed_mfu: float | None = None

    def to_record(self) -> dict[str, Any]:
        """The `predicted` entry of a result record (JSON-ready)."""
        return {
            "peak_memory_bytes": self.peak_memory_bytes,
            "step_time_s": self.step_time_s,
            "memory": dict(self.memory),
            "flops_per_step": self.flops_per_step,
            "assumptions": list(self.assumptions),
            "phases": dict(self.phases),
            "upper_bound_bytes": self.upper_bound_bytes,
            "block_terms": dict(self.block_terms),
            "assumed_mfu": self.assumed_mfu,
        }

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"peak memory  {format_bytes(self.peak_memory_bytes)} per device "
            f"(all components added: {format_bytes(self.upper_bound_bytes)})"
        ]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.memory.items() if n]
        lines += ["moments of a step, above parameters, optimizer state and buffers:"]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.phases.items()]
        time = "unknown (no peak FLOP rate)" if self.step_time_s is None else (
            f"{self.step_time_s:.4g} s"
        )
        lines.append(f"step time    {time}  ({self.flops_per_step:.3e} FLOPs per step)")
        lines.append("assumptions:")
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)


# --- the plan's settings -------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What the estimate reads from a plan's strategies, defaults filled in.

    The tables are parsed by the strategies themselves (`Strategy.parse`), so
    defaults, allowed values and error messages are theirs.
    """

    amp: str | None  # "bf16" | "fp16" | None (fp32 activations)
    checkpoint_every: int | None  # every k-th block checkpointed; None: no checkpointing
    fused_attention: str | None  # the attention the fused strategy swaps in, if present
    compile: bool
    optimizer: str  # "adamw" | "lamb"
    optimizer_impl: str  # "default" | "foreach" | "fused" | "triton"
    cross_entropy: str  # "eager" | "compile" | "triton"
    max_grad_norm: float  # LAMB's clipping (0: off)
    distributed: tuple[str, ...]  # distributed strategies in the plan

    @classmethod
    def of(cls, plan: Plan) -> Settings:
        import strategies  # noqa: F401  (registers the built-in strategies)
        from strategies.registry import get

        parsed = {
            name: get(name).parse(table, f"[strategies.{name}]")
            for name, table in plan.strategies.items()
        }
        amp, ckpt, fused, lamb = (parsed.get(n) for n in ("amp", "checkpoint", "fused", "lamb"))
        return cls(
            amp=amp.dtype if amp is not None else None,
            checkpoint_every=ckpt.every if ckpt is not None else None,
            fused_attention=fused.attention if fused is not None else None,
            compile=bool(fused is not None and fused.compile),
            optimizer="lamb" if lamb is not None else "adamw",
            optimizer_impl=fused.optimizer if fused is not None else "default",
            cross_entropy=fused.cross_entropy if fused is not None else "eager",
            max_grad_norm=lamb.max_grad_norm if lamb is not None else 0.0,
            distributed=tuple(sorted(n for n in parsed if get(n).distributed)),
        )


def checkpointed_blocks(layers: int, every: int | None) -> list[int]:
    """Indices of the checkpointed blocks: 0, k, 2k, ... (ceil(layers / k) of them),
    as strategies.checkpoint wraps them."""
    if not every:
        return []
    return list(range(0, layers, every))


# --- parameters, gradients, optimizer state --------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """Sizes read from the model built on the meta device."""

    parameters: int  # unique parameters (tied weights once)
    trainable: int  # of which require grad
    parameter_bytes: int
    trainable_bytes: int
    buffer_bytes: int
    # The for-loop optimizer's scratch: two temporaries of one parameter's size
    # and the previous parameter's, at their largest.
    loop_temporaries_bytes: int
    block_parameters: int | None  # parameters of blocks[0], when the model has blocks
    blocks: int | None
    # "explicit" / "sdpa": the kind of harness.workloads.attention core the model
    # uses (the fused strategy can swap those); None: no such core.
    attention_cores: str | None

    @classmethod
    def of(cls, workload: Workload) -> ModelFacts:
        from harness.workloads.attention import ATTENTION

        with torch.device("meta"):
            model = workload.build_model()
        params = list(model.parameters())  # unique by identity: tied weights once
        trainable = [p for p in params if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in trainable]
        buffers = {id(b): b for b in model.buffers()}.values()
        blocks = getattr(model, "blocks", None)
        has_blocks = isinstance(blocks, nn.ModuleList) and len(blocks) > 0
        cores = [
            kind for m in model.modules() for kind, cls in ATTENTION.items() if type(m) is cls
        ]
        return cls(
            parameters=sum(p.numel() for p in params),
            trainable=sum(p.numel() for p in trainable),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            trainable_bytes=sum(sizes),
            buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
            loop_temporaries_bytes=max(
                (2 * n + prev for prev, n in zip([0, *sizes], sizes, strict=False)), default=0
            ),
            block_parameters=(
                sum(p.numel() for p in blocks[0].parameters()) if has_blocks else None
            ),
            blocks=len(blocks) if has_blocks else None,
            attention_cores=cores[0] if cores else None,
        )


def state_memory(facts: ModelFacts, layout: Layout) -> dict[str, int]:
    """Parameters, gradients and optimizer state on one device.

    Parameters 4Ψ, gradients 4Ψ (held once, also across accumulation
    micro-steps) and AdamW's or LAMB's two moments 8Ψ, for fp32 parameters, on
    every rank: data parallelism without ZeRO replicates them. ZeRO, tensor and
    pipeline splits are not modelled (`layout_assumptions` says so).
    """
    del layout  # replicated: the same on every rank
    return {
        "parameters": facts.parameter_bytes,
        "gradients": facts.trainable_bytes,
        "optimizer_state": 2 * facts.trainable_bytes,
    }


def optimizer_temporaries(facts: ModelFacts, cfg: Settings, device_type: str) -> int:
    """Memory the optimizer step allocates and frees.

    torch's AdamW: foreach (its default on CUDA) builds the denominator
    sqrt(v) + eps for all parameters at once, one more copy of the trainable
    parameters; the for-loop (its default on CPU) goes one parameter at a time,
    keeping two temporaries and the previous parameter's denominator (measured
    on CPU); the fused kernel and our Triton multi-tensor kernels (`triton`)
    need none. strategies.lamb's LAMB: foreach ("foreach" or "fused") builds the
    denominator and the update u for all parameters (two copies), the loop
    (its "default") one parameter at a time, and gradient clipping scales a copy
    of all the gradients.
    """
    impl = cfg.optimizer_impl
    if impl == "triton":
        return 0
    if cfg.optimizer == "lamb":
        clip = facts.trainable_bytes if cfg.max_grad_norm > 0 else 0
        if impl in ("foreach", "fused"):
            return clip + 2 * facts.trainable_bytes
        return clip + facts.loop_temporaries_bytes
    if impl == "default":
        impl = "foreach" if device_type == "cuda" else "for-loop"
    if impl == "foreach":
        return facts.trainable_bytes
    if impl == "fused":
        return 0
    return facts.loop_temporaries_bytes


# --- transformer activations, term by term -----------------------------------------


@dataclass(frozen=True)
class Widths:
    """Bytes per element of each kind of tensor a transformer block saves.

    act     matmul inputs, GELU input and output, Q/K/V, attention output:
            2 under autocast, 4 in fp32.
    resid   the residual stream: LayerNorm inputs and checkpointed block inputs.
            It stays fp32 under autocast (embeddings are fp32, and fp32 + bf16
            adds promote to fp32), so 4 in both cases.
    softmax the attention probabilities softmax saves: CUDA autocast runs
            softmax in fp32 (4); CPU autocast leaves it in bf16 (2).
    mask    a dropout mask element: 1 on CUDA (native_dropout's bool mask);
            None where the mask has the dropped tensor's own dtype (CPU dropout
            multiplies by a noise tensor of the input's dtype).
    stats   each of LayerNorm's two per-row statistics (mean, rstd): 4 (fp32).
    """

    act: int
    resid: int
    softmax: int
    mask: int | None
    stats: int

    def mask_of(self, width: int) -> int:
        return width if self.mask is None else self.mask


# The paper's setting: every activation 16-bit, 1-byte masks, statistics left out.
PAPER = Widths(act=2, resid=2, softmax=2, mask=1, stats=0)


def widths_for(amp: bool, device_type: str) -> Widths:
    """What PyTorch keeps with (amp) or without autocast on `device_type`."""
    act = 2 if amp else 4
    if device_type == "cuda":
        return Widths(act=act, resid=4, softmax=4, mask=1, stats=4)
    return Widths(act=act, resid=4, softmax=act, mask=None, stats=4)


def attention_kind(requested: str, device_type: str, dropout: bool) -> str:
    """'explicit', 'fused' (flash / memory-efficient SDPA) or 'math' (SDPA's fallback).

    On CPU, SDPA's flash kernel takes no dropout: with dropout torch runs the
    math path, which materialises the scores in fp32.
    """
    if requested == "explicit":
        return "explicit"
    if device_type == "cpu" and dropout:
        return "math"
    return "fused"


def block_activation_terms(
    shape: TransformerShape,
    batch: int,
    widths: Widths,
    attention: str = "explicit",
    dropout: bool = False,
    fused_output_shared: bool = True,
    logsumexp_rows: int | None = None,
) -> dict[str, int]:
    """Bytes one pre-LayerNorm GPT block keeps for backward, by term.

    s sequence, b micro-batch, h hidden, a heads, f FFN hidden; w.x the widths.
    Korthikanti et al. (2022) eq. 1 counts, with 16-bit activations and 1-byte
    dropout masks, s·b·h·(34 + 5·a·s/h) bytes:

        attention  11·sbh + 5·as²b
          LayerNorm input            2 sbh
          QKV projection input       2 sbh
          Q and K (for QKᵀ)          4 sbh
          softmax output             2 as²b
          softmax dropout mask         as²b
          dropout output (for ·V)    2 as²b
          V                          2 sbh
          output projection input    2 sbh
          residual dropout mask        sbh
        MLP        19·sbh
          LayerNorm input            2 sbh
          FC1 input                  2 sbh
          GELU input                 8 sbh    (2·s·b·f, f = 4h)
          FC2 input (GELU output)    8 sbh
          dropout mask                 sbh

    What torch keeps differs, and each term below says how:

    - LayerNorm inputs are the residual stream, fp32 under autocast: w.resid
      (4), not 2, and LayerNorm also keeps mean and rstd (2·4·s·b bytes).
    - Without dropout the two masks and the softmax-dropout output go: the
      ·V matmul reads the softmax output itself, when it has the matmul's dtype.
      16-bit, no dropout: 32·sbh + 2·as²b.
    - CUDA autocast computes softmax in fp32: its output is 4·as²b and the ·V
      matmul keeps its own bf16 copy (2·as²b), dropout or not.
    - CPU dropout keeps a mask in the dropped tensor's dtype, not a bool.
    - fp32 activations: every 2-byte term is 4 bytes; masks stay 1 (CUDA).
    - Q, K and V are strided views of the QKV output: the explicit matmuls
      keep contiguous copies (2+2+2 sbh at 16-bit); the QKV output itself is
      not kept.
    - Fused SDPA (flash / memory-efficient) keeps no s² term: it keeps Q, K, V
      (the QKV output, 6 sbh at 16-bit), its output (2 sbh) and a fp32
      log-sum-exp per row and head (4·a·s·b). The kernels (CUDA flash and
      memory-efficient, CPU flash) lay their output out as (b, s, a, d), so
      the output projection's input, `y.transpose(1, 2).contiguous()`, is that
      same tensor (`fused_output_shared`, measured on CPU).
    - SDPA's math fallback ('math', CPU with dropout) computes attention in fp32:
      Q, K, V copies, softmax, mask and dropout output are all 4 bytes.

    Tensors that do not grow with the batch (a causal mask, position ids) are
    left out.
    """
    s, b, h, a, f = shape.seq_len, batch, shape.hidden, shape.heads, shape.ffn_hidden
    w = widths
    sbh, as2b = s * b * h, a * s * s * b
    t: dict[str, int] = {}
    t["ln1_input"] = w.resid * sbh
    t["ln1_stats"] = 2 * w.stats * s * b
    t["qkv_input"] = w.act * sbh
    if attention in ("explicit", "math"):
        core = w.act if attention == "explicit" else 4
        soft = w.softmax if attention == "explicit" else 4
        t["q_and_k"] = 2 * core * sbh
        t["softmax_output"] = soft * as2b
        t["attention_dropout_mask"] = w.mask_of(soft) * as2b if dropout else 0
        # The ·V matmul's input: the dropout output, or a cast of the softmax
        # output, or (same dtype, no dropout) the softmax output itself.
        t["probs_for_v"] = core * as2b if dropout or soft != core else 0
        t["v"] = core * sbh
        t["proj_input"] = w.act * sbh
    elif attention == "fused":
        rows = s if logsumexp_rows is None else logsumexp_rows
        t["qkv_output"] = 3 * w.act * sbh
        t["attention_output"] = w.act * sbh
        t["logsumexp"] = 4 * a * rows * b
        t["proj_input"] = 0 if fused_output_shared else w.act * sbh
    else:
        raise ValueError(f"attention {attention!r}: 'explicit', 'fused' or 'math'")
    t["residual_dropout_mask"] = w.mask_of(w.act) * sbh if dropout else 0
    t["ln2_input"] = w.resid * sbh
    t["ln2_stats"] = 2 * w.stats * s * b
    t["fc1_input"] = w.act * sbh
    t["gelu_input"] = w.act * s * b * f
    t["fc2_input"] = w.act * s * b * f
    t["mlp_dropout_mask"] = w.mask_of(w.act) * sbh if dropout else 0
    return t


def block_backward_working_bytes(
    terms: dict[str, int], shape: TransformerShape, batch: int, widths: Widths, attention: str
) -> int:
    """The most one block's backward holds beyond the tensors it saved (`terms`).

    The gradient of the residual stream (fp32, 4·s·b·h) is live throughout. On
    top of it, either GELU's backward: the gradients of its output and input (two
    s·b·f tensors) once FC2's saved input is freed, one s·b·f net; or, for
    explicit attention, softmax's backward: the gradients of its output and
    input (two a·s²·b tensors in the softmax dtype), by when the MLP's saved
    tensors, the output projection's input, V and the ·V input are freed.
    """
    s, b, h, a, f = shape.seq_len, batch, shape.hidden, shape.heads, shape.ffn_hidden
    mlp = widths.act * s * b * f
    attn = 0
    if attention != "fused":
        soft = 4 if attention == "math" else widths.softmax
        freed = sum(
            terms.get(k, 0)
            for k in (
                "ln2_input", "ln2_stats", "fc1_input", "gelu_input", "fc2_input",
                "mlp_dropout_mask", "residual_dropout_mask", "proj_input", "v", "probs_for_v",
            )
        )
        attn = 2 * soft * a * s * s * b - freed
    return 4 * s * b * h + max(mlp, attn, 0)


def korthikanti_bytes(shape: TransformerShape, batch: int) -> int:
    """The paper's eq. 1 for one block: s·b·h·(34 + 5·a·s/h) bytes."""
    s, b, h, a = shape.seq_len, batch, shape.hidden, shape.heads
    return 34 * s * b * h + 5 * a * s * s * b


def lm_outside_block_terms(
    shape: TransformerShape, batch: int, widths: Widths, dropout: bool
) -> dict[str, int]:
    """What a GPT keeps outside its blocks, except the loss (see `logits_bytes`):
    the token ids and targets, the embedding dropout's mask, the final LayerNorm's
    input and statistics, the LM head's input."""
    s, b, h = shape.seq_len, batch, shape.hidden
    sbh = s * b * h
    return {
        "token_ids_and_targets": 2 * 8 * s * b,  # int64, kept by the embedding and the loss
        "embedding_dropout_mask": widths.mask_of(widths.resid) * sbh if dropout else 0,
        "final_norm_input": widths.resid * sbh + 2 * widths.stats * s * b,
        "head_input": widths.act * sbh,
    }


def logits_bytes(shape: TransformerShape, batch: int, chunked_width: int | None = None) -> int:
    """The language-model loss at its largest: 12·b·s·V bytes.

    Cross-entropy runs in fp32 (autocast's fp32 list on CPU and CUDA) and keeps
    its log-softmax output (4·bsV). In forward the logits (2 or 4·bsV), their
    fp32 copy under autocast (4·bsV) and the log-softmax live together: 8 to
    10·bsV. At the start of backward the log-softmax output, the gradient
    nll_loss hands back and the one log-softmax's backward makes are all fp32
    and alive together: 12·bsV, the larger.

    kernels.cross_entropy's chunked Triton kernel (fused cross_entropy =
    'triton') holds no log-probabilities: it writes the gradient over the
    logits, in their dtype (`chunked_width` bytes), and scales it in place.
    """
    if chunked_width is not None:
        return chunked_width * batch * shape.seq_len * shape.vocab
    return 12 * batch * shape.seq_len * shape.vocab


def block_forward_flops_per_sample(shape: TransformerShape, block_parameters: int | None) -> float:
    """Forward FLOPs of one block for one sample: 2·N_block + 4·h·s per token."""
    s, h, f = shape.seq_len, shape.hidden, shape.ffn_hidden
    n = block_parameters if block_parameters is not None else 4 * h * h + 2 * h * f
    return s * (2 * n + 4 * h * s)


# --- any model: trace what autograd saves ---------------------------------------------


@dataclass
class Trace:
    """What one traced forward pass keeps for backward, in bytes."""

    activations: int  # saved by the blocks (by the whole model when it has none)
    other_activations: int  # saved outside the blocks (embedding, head, loss)
    recompute: int  # the largest checkpointed block's own saved tensors, its input aside
    weight_copies: int  # autocast's 16-bit copies of parameters that backward needs
    weight_copies_kept: int  # of which saved outside checkpointed blocks
    weight_copies_rebuilt: int  # the largest checkpointed block's, made again when rebuilt
    largest_saved: int  # the largest single saved storage (backward's working set)
    checkpointed: list[int]  # indices of the checkpointed blocks
    stored_by_block: list[int]  # bytes each block keeps (a checkpointed one: its input)
    params_by_block: list[int]  # bytes of each block's trainable parameters
    recompute_flops: float  # forward FLOPs of the checkpointed blocks, per micro-batch
    calls_sdpa: bool  # whether the forward called scaled_dot_product_attention
    notes: list[str] = field(default_factory=list)


_VIEW_NODES = {
    "TBackward", "ViewBackward", "TransposeBackward", "PermuteBackward",
    "ExpandBackward", "AliasBackward", "UnsafeViewBackward", "SliceBackward",
    "SelectBackward", "ReshapeAliasBackward", "AsStridedBackward",
}


def _is_parameter_copy(t: torch.Tensor, param_ids: set[int]) -> bool:
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


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            yield leaf


class _TraceOps(torch.overrides.TorchFunctionMode):
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


def trace_activations(
    workload: Workload,
    micro_batch: int,
    amp: bool,
    device_type: str,
    checkpoint_every: int | None = None,
) -> Trace:
    """Trace `workload.loss` on fake tensors and add up what autograd saves.

    Saved tensors are counted once per storage (views share), leaving out
    parameters, buffers and autocast's weight copies (counted apart). Under amp
    the trace runs CPU autocast in bf16, with CUDA's fp32 norms and softmax
    emulated when `device_type` is 'cuda'. With checkpointing, a checkpointed
    block keeps only its inputs. Falls back to the meta device without autocast
    when fake tensors fail, and says so in `notes`.
    """
    try:
        return _trace(workload, micro_batch, amp, device_type, checkpoint_every, fake=True)
    except Exception as e:  # a workload fake tensors cannot run: meta, no autocast
        trace = _trace(workload, micro_batch, False, device_type, checkpoint_every, fake=False)
        trace.notes.append(
            f"Could not trace on fake tensors ({type(e).__name__}: {e}); traced on the meta "
            "device without autocast, so 16-bit activations are counted at fp32 width."
        )
        return trace


def _fake_model(workload: Workload, mode: Any) -> nn.Module:
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


def _trace(
    workload: Workload,
    micro_batch: int,
    amp: bool,
    device_type: str,
    every: int | None,
    fake: bool,
) -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.utils._pytree import tree_map
    from torch.utils.flop_counter import FlopCounterMode

    mode = FakeTensorMode() if fake else None
    if mode is not None:
        model = _fake_model(workload, mode)
        try:
            with mode:
                batch = workload.batch(micro_batch, 0, "cpu")
        except Exception:  # a batch source fake tensors cannot run: make it for real
            with unset_fake_temporarily():
                real = workload.batch(micro_batch, 0, "cpu")
            batch = tree_map(
                lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, real
            )
    else:
        with torch.device("meta"):
            model = workload.build_model()
            batch = workload.batch(micro_batch, 0, "meta")
    model.train()

    params = list(model.parameters())
    param_ids = {id(p) for p in params}
    excluded = {_storage_key(p) for p in params} | {_storage_key(b) for b in model.buffers()}

    blocks = getattr(model, "blocks", None)
    blocks = list(blocks) if isinstance(blocks, nn.ModuleList) else []
    current: list[int] = []
    block_inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any], dict[int, int]]] = {}
    handles = []
    for i, block in enumerate(blocks):

        def pre(_m: nn.Module, args: Any, kwargs: Any, i: int = i) -> None:
            current.append(i)
            sizes = {
                _storage_key(x): x.untyped_storage().nbytes() for x in _tensors((args, kwargs))
            }
            block_inputs.setdefault(i, (args, kwargs, sizes))

        def post(_m: nn.Module, _args: Any, _out: Any) -> None:
            current.pop()

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post))

    held: list[torch.Tensor] = []  # keeps storages alive so their keys stay unique
    owners: dict[int, tuple[int, set[int | None]]] = {}  # storage -> (bytes, savers)
    copies: dict[int, tuple[int, set[int | None]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        held.append(t)
        key = _storage_key(t)
        if key in excluded:
            return t
        table = copies if key in copies or _is_parameter_copy(t, param_ids) else owners
        entry = table.setdefault(key, (t.untyped_storage().nbytes(), set()))
        entry[1].add(current[-1] if current else None)
        return t

    ops = _TraceOps(cuda_fp32=amp and fake and device_type == "cuda")
    with contextlib.ExitStack() as stack:
        if mode is not None:
            stack.enter_context(mode)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        stack.enter_context(ops)
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp and fake))
        held.append(workload.loss(model, batch))  # the graph, alive until we are done
    for h in handles:
        h.remove()

    ckpt = set(checkpointed_blocks(len(blocks), every))
    activations = other = 0
    kept: set[int] = set()
    by_block: dict[int, int] = {}  # kept bytes by the first block that keeps them
    for key, (n, who) in owners.items():
        live = who - ckpt
        if not live:
            continue  # saved only inside checkpointed blocks: not kept
        kept.add(key)
        in_blocks = sorted(o for o in live if o is not None)
        if not blocks or in_blocks:
            activations += n
            if in_blocks:
                by_block[in_blocks[0]] = by_block.get(in_blocks[0], 0) + n
        else:
            other += n
    for i in sorted(ckpt):
        for key, n in block_inputs.get(i, ((), {}, {}))[2].items():
            if key not in kept and key not in excluded:
                kept.add(key)
                activations += n
                by_block[i] = by_block.get(i, 0) + n
    # A rebuilt block's own tensors; its input is kept already.
    per_block = {
        i: sum(n for key, (n, who) in owners.items() if i in who and key not in block_inputs[i][2])
        for i in ckpt
    }

    recompute_flops = 0.0
    notes: list[str] = []
    if ckpt:
        try:
            with contextlib.ExitStack() as stack:
                if mode is not None:
                    stack.enter_context(mode)
                stack.enter_context(torch.no_grad())
                counter = stack.enter_context(FlopCounterMode(display=False))
                for i in sorted(ckpt):
                    args, kwargs, _ = block_inputs[i]
                    blocks[i](*args, **kwargs)
            recompute_flops = float(counter.get_total_flops())
        except Exception as e:
            notes.append(f"Recompute FLOPs not counted ({type(e).__name__}: {e}).")
    return Trace(
        activations=activations,
        other_activations=other,
        recompute=max(per_block.values(), default=0),
        weight_copies=sum(n for n, _ in copies.values()),
        weight_copies_kept=sum(n for n, who in copies.values() if who - ckpt),
        weight_copies_rebuilt=max(
            (sum(n for n, who in copies.values() if i in who) for i in ckpt), default=0
        ),
        largest_saved=max((n for n, _ in owners.values()), default=0),
        checkpointed=sorted(ckpt),
        stored_by_block=[by_block.get(i, 0) for i in range(len(blocks))],
        params_by_block=[
            sum(p.numel() * p.element_size() for p in block.parameters() if p.requires_grad)
            for block in blocks
        ],
        recompute_flops=recompute_flops,
        calls_sdpa=ops.calls_sdpa,
        notes=notes,
    )


# --- the estimate ---------------------------------------------------------------


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



def layout_assumptions(layout: Layout, distributed: tuple[str, ...]) -> list[str]:
    """What the estimate says about splitting the work over several devices."""
    if distributed:
        return [
            f"Not modelled: {', '.join(distributed)}. Memory is given as if one device held "
            "the whole model, its gradients and optimizer state (no ZeRO, tensor or pipeline "
            "split, no communication buffers); only the FLOPs are divided over the ranks."
        ]
    if layout.world_size > 1:
        return [
            f"Layout {layout.data} x {layout.pipeline} x {layout.tensor} (data x pipeline x "
            "tensor): every device is taken to hold the whole model, its gradients and "
            "optimizer state; only the FLOPs are divided over the ranks."
        ]
    return []


@dataclass
class ActivationParts:
    """The activation side of an estimate, and what the moments of a step need."""

    memory: dict[str, int]  # activations, other_activations, logits, backward_working,
    # recompute, autocast_weight_copies
    assumptions: list[str]
    block_terms: dict[str, int] = field(default_factory=dict)
    # Autocast's weight copies live in its cache until forward ends; after that
    # only those saved outside checkpointed blocks stay (None: all of them), and a
    # rebuilt block makes its own again.
    copies_kept: int | None = None
    copies_rebuilt: int = 0
    loss_forward: int = 0  # the language-model loss's transient in forward
    # Per block: what it keeps and its parameters' bytes; the checkpointed ones.
    stored: list[int] = field(default_factory=list)
    block_param_bytes: list[int] = field(default_factory=list)
    checkpointed: list[int] = field(default_factory=list)
    recompute_flops_per_sample: float = 0.0


def transformer_activations(
    shape: TransformerShape,
    lm: bool,
    cfg: Settings,
    facts: ModelFacts,
    device_type: str,
    batch: int,
    trace: Trace | None,
) -> ActivationParts:
    """Activations of a transformer, term by term; outside the blocks a language
    model's terms (`lm`), else the trace's."""
    amp = cfg.amp is not None
    dropout = shape.dropout > 0
    if facts.attention_cores is not None:  # harness cores, which `fused` swaps
        requested = cfg.fused_attention or facts.attention_cores
    else:
        requested = "sdpa" if trace is not None and trace.calls_sdpa else "explicit"
    kind = attention_kind(requested, device_type, dropout)
    widths = widths_for(amp, device_type)
    terms = block_activation_terms(
        shape,
        batch,
        widths,
        attention=kind,
        dropout=dropout,
        # memory-efficient attention (CUDA's fused kernel for fp32) pads rows to 32
        logsumexp_rows=(
            32 * math.ceil(shape.seq_len / 32) if device_type == "cuda" and not amp else None
        ),
    )
    per_block = sum(terms.values())
    ckpt = checkpointed_blocks(shape.layers, cfg.checkpoint_every)
    stored_input = widths.resid * shape.seq_len * batch * shape.hidden
    h, f = shape.hidden, shape.ffn_hidden
    block_params = facts.block_parameters or 4 * h * h + 2 * h * f
    width = round(facts.parameter_bytes / max(facts.parameters, 1))
    memory = {
        "activations": len(ckpt) * stored_input + (shape.layers - len(ckpt)) * per_block,
        "backward_working": block_backward_working_bytes(terms, shape, batch, widths, kind),
        # The rebuilt block's tensors; its input (LayerNorm's) is kept already.
        "recompute": per_block - terms["ln1_input"] if ckpt else 0,
    }
    parts = ActivationParts(
        memory=memory,
        assumptions=[],
        block_terms=terms,
        stored=[stored_input if i in ckpt else per_block for i in range(shape.layers)],
        block_param_bytes=[block_params * width] * shape.layers,
        checkpointed=ckpt,
        recompute_flops_per_sample=len(ckpt)
        * block_forward_flops_per_sample(shape, facts.block_parameters),
    )
    sbh = shape.seq_len * batch * shape.hidden
    parts.assumptions += [
        f"Transformer activations per block follow Korthikanti et al. (2022) eq. 1 term "
        f"by term, adapted to what PyTorch keeps on {device_type}: "
        f"{per_block:,} bytes per block ({per_block / sbh:.2f}·s·b·h) with "
        f"{'16-bit' if amp else 'fp32'} activations, an fp32 residual stream "
        f"(LayerNorm inputs), {kind} attention"
        + (f" and dropout {shape.dropout:g}" if dropout else " and no dropout")
        + "; see block_terms.",
        "The blocks are pre-LayerNorm transformer blocks (LayerNorm, one QKV projection, "
        "attention, output projection; LayerNorm, FC, GELU, FC); tensors that do not "
        "grow with the batch are left out.",
    ]
    if kind == "fused":
        parts.assumptions.append(
            "SDPA runs a fused kernel (flash / memory-efficient): no s² terms, a fp32 "
            "log-sum-exp per row and head instead."
        )
    elif kind == "math":
        parts.assumptions.append(
            "SDPA on CPU with dropout runs its math path, which keeps fp32 scores."
        )

    if lm:
        memory["other_activations"] = sum(
            lm_outside_block_terms(shape, batch, widths, dropout).values()
        )
        chunked = widths.act if cfg.cross_entropy == "triton" else None
        memory["logits"] = logits_bytes(shape, batch, chunked)
        sbv = batch * shape.seq_len * shape.vocab
        parts.loss_forward = memory["logits"] if chunked else (10 if amp else 8) * sbv
        parts.assumptions.append(
            "The language-model loss peaks at 12·b·s·V bytes at the start of backward "
            "(the fp32 log-softmax output and two fp32 gradients of its size)."
            if chunked is None
            else "The chunked Triton cross-entropy holds only the logits, overwritten by "
            "their gradient."
        )
    else:
        assert trace is not None, "a transformer that is no language model is traced"
        memory["other_activations"] = trace.other_activations
        memory["backward_working"] = max(memory["backward_working"], trace.largest_saved)
        parts.assumptions.append(
            "Outside the blocks (embedding, head, loss) what autograd saves is traced on "
            "fake tensors."
        )
    if trace is not None:
        memory["autocast_weight_copies"] = trace.weight_copies
        parts.copies_kept = trace.weight_copies_kept
        parts.copies_rebuilt = trace.weight_copies_rebuilt
    elif amp:
        memory["autocast_weight_copies"] = 2 * facts.parameters
        if ckpt:
            parts.copies_kept = 2 * max(0, facts.parameters - len(ckpt) * block_params)
            parts.copies_rebuilt = 2 * block_params
        parts.assumptions.append(
            "Autocast's 16-bit weight copies are counted at 2 bytes for every parameter "
            "(an upper bound: norms and position embeddings are not cast)."
        )
    return parts


def traced_activations(trace: Trace, batch: int) -> ActivationParts:
    """Activations of any model, as the trace of its forward pass counted them."""
    return ActivationParts(
        memory={
            "activations": trace.activations,
            "other_activations": trace.other_activations,
            "recompute": trace.recompute,
            "backward_working": trace.largest_saved,
            "autocast_weight_copies": trace.weight_copies,
        },
        assumptions=[
            "Activations are counted by tracing one forward pass on fake tensors: what "
            "autograd saves, once per storage, parameters, buffers and autocast weight "
            "copies apart. Backward's working set is taken as the largest saved tensor "
            "(the gradients of an op's output and input, while what follows is freed)."
        ],
        copies_kept=trace.weight_copies_kept,
        copies_rebuilt=trace.weight_copies_rebuilt,
        stored=trace.stored_by_block,
        block_param_bytes=trace.params_by_block,
        checkpointed=trace.checkpointed,
        recompute_flops_per_sample=trace.recompute_flops / batch,
    )


def step_phases(memory: dict[str, int], parts: ActivationParts, grads_held: int) -> dict[str, int]:
    """What lives above parameters, optimizer state and buffers at each moment of a step.

    Gradients are None at the start of backward (the step zeroes them with
    set_to_none=True) unless earlier micro-steps made them (`grads_held`). The
    loss's transient comes first in backward and is gone before any block's.
    """
    copies = memory["autocast_weight_copies"]
    kept = copies if parts.copies_kept is None else parts.copies_kept
    saved = memory["activations"] + memory["other_activations"] + grads_held
    phases = {
        "forward_end": copies + saved + parts.loss_forward,
        "backward_start": kept + saved + max(memory["logits"], memory["backward_working"]),
    }
    if memory["recompute"]:
        phases["checkpoint_recompute"] = (
            kept
            + parts.copies_rebuilt
            + memory["other_activations"]
            + memory["recompute"]
            + memory["backward_working"]
            + rebuild_moment(
                parts.stored,
                parts.block_param_bytes,
                parts.checkpointed,
                memory["gradients"],
                grads_held,
            )
        )
    phases["optimizer_step"] = memory["gradients"] + memory["optimizer_temporaries"]
    return phases


def estimate(
    plan: Plan,
    workload: Workload,
    env: RuntimeEnv,
    peak_flops: float | None = None,
) -> Estimate:
    """Predicted per-device peak memory and step time of `plan`; nothing is run.

    `peak_flops` is the device's peak FLOP rate (harness.peaks); without it the
    step time is None. Strategy settings the plan leaves out take the
    strategies' defaults; a bad setting is a HarnessError.
    """
    cfg = Settings.of(plan)
    facts = ModelFacts.of(workload)
    amp = cfg.amp is not None
    b = plan.micro_batch_size
    memory = dict.fromkeys(COMPONENTS, 0)
    memory.update(state_memory(facts, plan.layout))
    memory["buffers"] = facts.buffer_bytes
    memory["optimizer_temporaries"] = optimizer_temporaries(facts, cfg, env.device_type)

    optimizer = "LAMB" if cfg.optimizer == "lamb" else "AdamW"
    width = facts.parameter_bytes / max(facts.parameters, 1)
    assumptions = [
        f"Parameters ({width:g} bytes each, their dtype), gradients ({width:g}) and "
        f"{optimizer}'s two moments (2 x {width:g}) for Ψ = {facts.parameters:,} unique "
        "parameters (tied weights once); gradients are held once, also across accumulation "
        "micro-steps.",
        f"Activations are for one micro-batch of {b} samples per device.",
    ]
    if amp:
        assumptions.append(
            f"Autocast ({cfg.amp}) keeps master weights, gradients and optimizer state fp32 "
            "and 16-bit activations for matmul inputs."
        )
    if cfg.compile or cfg.cross_entropy == "compile":
        assumptions.append(
            "torch.compile is estimated as eager: its partitioner usually saves fewer "
            "activations, so the estimate is high."
        )
    assumptions += layout_assumptions(plan.layout, cfg.distributed)

    shape = workload.shape
    # A language model: its head and loss act on every token (the GPT). Other
    # models' outside of the blocks is traced (a ViT's head sees one token).
    lm = shape is not None and workload.tokens_per_sample is not None
    trace = None
    if shape is None or not lm or facts.attention_cores is None:
        trace = trace_activations(workload, b, amp, env.device_type, cfg.checkpoint_every)
        assumptions += trace.notes
    if shape is not None:
        parts = transformer_activations(shape, lm, cfg, facts, env.device_type, b, trace)
    else:
        assert trace is not None
        parts = traced_activations(trace, b)
        if cfg.checkpoint_every and facts.blocks is None:
            parts.assumptions.append(
                "The model has no `blocks` ModuleList: checkpointing is not modelled."
            )
    memory.update(parts.memory)
    assumptions += parts.assumptions
    if trace is not None and amp:
        assumptions.append(
            "The trace runs CPU autocast in bf16"
            + (", with CUDA's fp32 norms and softmax emulated." if env.device_type == "cuda"
               else ".")
        )
    if parts.checkpointed:
        k, n = cfg.checkpoint_every, len(parts.checkpointed)
        layers = shape.layers if shape is not None else facts.blocks
        assumptions.append(
            f"Checkpointing every {k} block(s): blocks 0, {k}, ... ({n} of {layers}) keep "
            "only their input; one is rebuilt at a time in backward (recompute), adding one "
            "forward of each checkpointed block to the step's FLOPs."
        )

    grads_held = memory["gradients"] if plan.accumulation_steps > 1 else 0
    phases = step_phases(memory, parts, grads_held)
    persistent = memory["parameters"] + memory["optimizer_state"] + memory["buffers"]
    peak = persistent + max(phases.values())
    assumptions.append(
        "Peak = parameters, optimizer state and buffers, plus the largest moment of a step: "
        "the end of forward (autocast's weight cache still full), the start of backward "
        "(activations with the loss's or a block's working set, gradients not yet allocated"
        + (", except those of earlier micro-steps" if grads_held else "")
        + "), the rebuild of a checkpointed block, or the optimizer step (gradients "
        "and its temporaries). Allocator fragmentation and caching are not counted; "
        "upper_bound_bytes adds every component instead."
    )

    flops_per_sample = float(workload.flops_per_sample())
    flops_per_step = (flops_per_sample + parts.recompute_flops_per_sample) * plan.batch_size
    flops_per_device = flops_per_step / plan.world_size
    mfu = ASSUMED_MFU.get(env.device_type, ASSUMED_MFU["cpu"])
    step_time = None
    if peak_flops is not None and peak_flops > 0:
        step_time = flops_per_device / (peak_flops * mfu)
        assumptions.append(
            f"Step time = FLOPs per device ({flops_per_device:.3e}, the global batch of "
            f"{plan.batch_size} over {plan.world_size} device(s)) / ({peak_flops:.3e} FLOP/s "
            f"peak x assumed MFU {mfu:g}"
            + (", of a measured CPU peak" if env.device_type == "cpu" else "")
            + "); communication and data loading are not counted."
        )
    else:
        assumptions.append("No peak FLOP rate was given: step time is not estimated.")

    memory = {k: int(v) for k, v in memory.items()}
    return Estimate(
        peak_memory_bytes=int(peak),
        step_time_s=step_time,
        memory=memory,
        flops_per_step=flops_per_step,
        assumptions=assumptions,
        phases={k: int(v) for k, v in phases.items()},
        upper_bound_bytes=sum(memory.values()),
        block_terms=parts.block_terms,
        assumed_mfu=mfu,
    )
