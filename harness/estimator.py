"""Predicted peak memory and step time of a plan, without running it.

`estimate(plan, workload, env, peak_flops)` adds up, per device:

- parameters, gradients and optimizer state, from the parameter count of the
  model built on the meta device (tied weights once);
- activations: for transformers (`workload.shape` set) term by term after
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1, adapted to what PyTorch actually saves (see
  `block_activation_terms`); for other models by tracing one forward pass on
  fake tensors and adding up what autograd saves (`trace_activations`);
- the transient of the language-model loss, the 16-bit weight copies autocast
  keeps, under activation checkpointing the one block rebuilt at a time, and
  the optimizer step's temporaries.

These components do not all live at once. The peak is the persistent state
(parameters, optimizer state, buffers) plus the largest of three moments of a
step (`Estimate.phases`): the start of backward (all activations and the loss's
transient, no gradients yet: `zero_grad(set_to_none=True)`), the rebuild of a
checkpointed block, and the optimizer step (gradients and temporaries, the
activations gone). The plain sum of the components is kept as an upper bound.

Step time is the step's FLOPs over an assumed fraction of the device's peak.
Every figure comes with the sentences that state what it assumes
(`Estimate.assumptions`): the estimate is meant to be checked against
measurements, and those sentences say where it can be wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.device import RuntimeEnv
from harness.errors import HarnessError
from harness.plan import Layout, Plan
from harness.workloads.base import TransformerShape, Workload

# Assumed fraction of the peak FLOP rate a training step reaches. On CUDA the
# peak is the datasheet (or calibration-matmul) figure; on CPU it is a measured
# matmul peak, which a whole training step gets closer to.
ASSUMED_MFU = {"cuda": 0.4, "cpu": 0.5}

# The components of `Estimate.memory`, in the order they are summed and shown.
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
    not apply): parameters, gradients, optimizer_state, buffers,
    autocast_weight_copies; activations (what the repeated blocks keep for
    backward, or the whole model's when it has no blocks), other_activations
    (what the rest keeps: token ids, embeddings, final norm, head input, loss),
    logits (the language-model loss's transient at the start of backward),
    backward_working (the most one block's or op's backward holds beyond what it
    saved), recompute (one checkpointed block's activations, rebuilt during
    backward) and optimizer_temporaries (the optimizer step's scratch memory).

    `phases` gives the transient memory of each moment of a step; the peak is
    the persistent state (parameters, optimizer_state, buffers) plus the largest
    phase. `upper_bound_bytes` is the plain sum of the components.
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
            f"(sum of all components {format_bytes(self.upper_bound_bytes)})"
        ]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.memory.items() if n]
        lines += ["moments of a step, above the persistent state:"]
        lines += [f"  {name:<24}{format_bytes(n)}" for name, n in self.phases.items()]
        time = "unknown (no peak FLOP rate)" if self.step_time_s is None else (
            f"{self.step_time_s:.4g} s"
        )
        lines.append(f"step time    {time}  ({self.flops_per_step:.3e} FLOPs per step)")
        lines.append("assumptions:")
        lines += [f"  - {a}" for a in self.assumptions]
        return "\n".join(lines)


def format_bytes(n: float) -> str:
    """Binary units with two decimals: 512 B, 1.50 KiB, 3.25 GiB."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{sign}{n:.2f} {unit}"
    raise AssertionError("unreachable")


# --- the plan's settings -------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What the estimate reads from a plan, with the strategies' defaults filled in."""

    amp: str | None  # "bf16" | "fp16" | None (fp32 activations)
    checkpoint_every: int | None  # every k-th block checkpointed; None: no checkpointing
    attention: str  # "explicit" | "sdpa"
    compile: bool
    optimizer: str  # "adamw" | "lamb"
    optimizer_impl: str  # "default" | "foreach" | "fused"

    @classmethod
    def of(cls, plan: Plan) -> Settings:
        st = plan.strategies
        amp = None
        if "amp" in st:
            amp = st["amp"].get("dtype", "bf16")
            if amp not in ("bf16", "fp16"):
                raise HarnessError(f"[strategies.amp] dtype = {amp!r}: use 'bf16' or 'fp16'")
        every = None
        if "checkpoint" in st:
            every = st["checkpoint"].get("every", 1)
            if not isinstance(every, int) or every < 1:
                raise HarnessError(
                    f"[strategies.checkpoint] every = {every!r}: use a whole number, 1 or more"
                )
        fused = st.get("fused")
        if fused is not None:
            attention = fused.get("attention", "sdpa")
        else:
            attention = plan.workload_args.get("attention", "explicit")
        if attention not in ("explicit", "sdpa"):
            raise HarnessError(f"attention = {attention!r}: use 'explicit' or 'sdpa'")
        impl = fused.get("optimizer", "default") if fused is not None else "default"
        if impl not in ("default", "foreach", "fused"):
            raise HarnessError(
                f"[strategies.fused] optimizer = {impl!r}: use 'default', 'foreach' or 'fused'"
            )
        return cls(
            amp=amp,
            checkpoint_every=every,
            attention=attention,
            compile=bool(fused.get("compile", False)) if fused is not None else False,
            optimizer="lamb" if "lamb" in st else "adamw",
            optimizer_impl=impl,
        )


def checkpointed_blocks(layers: int, every: int | None) -> list[int]:
    """Indices of the checkpointed blocks: 0, k, 2k, ... (ceil(layers / k) of them)."""
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
    # and the previous parameter's denominator, at their largest.
    loop_temporaries_bytes: int
    block_parameters: int | None  # parameters of blocks[0], when the model has blocks
    blocks: int | None

    @classmethod
    def of(cls, workload: Workload) -> ModelFacts:
        with torch.device("meta"):
            model = workload.build_model()
        params = list(model.parameters())  # unique by identity: tied weights once
        trainable = [p for p in params if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in trainable]
        buffers = {id(b): b for b in model.buffers()}.values()
        blocks = getattr(model, "blocks", None)
        has_blocks = isinstance(blocks, nn.ModuleList) and len(blocks) > 0
        return cls(
            parameters=sum(p.numel() for p in params),
            trainable=sum(p.numel() for p in trainable),
            parameter_bytes=sum(p.numel() * p.element_size() for p in params),
            trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
            buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
            loop_temporaries_bytes=max(
                (2 * n + prev for prev, n in zip([0, *sizes], sizes, strict=False)), default=0
            ),
            block_parameters=(
                sum(p.numel() for p in blocks[0].parameters()) if has_blocks else None
            ),
            blocks=len(blocks) if has_blocks else None,
        )


def state_memory(facts: ModelFacts, layout: Layout) -> dict[str, int]:
    """Parameters, gradients and optimizer state on one device.

    Without ZeRO every data-parallel rank holds all three whole: parameters 4Ψ,
    gradients 4Ψ (held once, also across accumulation micro-steps) and AdamW's
    or LAMB's two moments 8Ψ, for fp32 parameters. The layout does not shrink
    them: data parallelism replicates, and tensor / pipeline splits are stated
    as not modelled by `layout_assumptions`.
    """
    del layout  # replicated state: the same on every rank
    return {
        "parameters": facts.parameter_bytes,
        "gradients": facts.trainable_bytes,
        "optimizer_state": 2 * facts.trainable_bytes,
    }


def optimizer_temporaries(facts: ModelFacts, cfg: Settings, device_type: str) -> int:
    """Memory the optimizer step allocates and frees.

    AdamW's foreach implementation (torch's default on CUDA) builds the
    denominator sqrt(v) + eps for all parameters at once: one more copy of the
    trainable parameters. The for-loop (the default on CPU) does it one
    parameter at a time, keeping two temporaries and the previous parameter's
    denominator (measured on CPU). The fused kernel needs
    none. LAMB is taken to build one update of the parameters' size before its
    trust ratio.
    """
    if cfg.optimizer == "lamb":
        return facts.trainable_bytes
    impl = cfg.optimizer_impl
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


def outside_block_terms(
    shape: TransformerShape, batch: int, widths: Widths, dropout: bool
) -> dict[str, int]:
    """What a GPT keeps outside its blocks, except the loss (see `logits_bytes`)."""
    s, b, h = shape.seq_len, batch, shape.hidden
    sbh = s * b * h
    return {
        "token_ids_and_targets": 2 * 8 * s * b,  # int64, kept by the embedding and the loss
        "embedding_dropout_mask": widths.mask_of(widths.resid) * sbh if dropout else 0,
        "final_norm_input": widths.resid * sbh + 2 * widths.stats * s * b,
        "head_input": widths.act * sbh,
    }


def logits_bytes(shape: TransformerShape, batch: int) -> int:
    """The language-model loss at its largest: 12·b·s·V bytes.

    Cross-entropy runs in fp32 (autocast's fp32 list on CPU and CUDA) and keeps
    its log-softmax output (4·bsV). In forward the logits (2 or 4·bsV), their
    fp32 copy under autocast (4·bsV) and the log-softmax live together: 8 to
    10·bsV. At the start of backward the log-softmax output, the gradient
    nll_loss hands back and the one log-softmax's backward makes are all fp32
    and alive together: 12·bsV, the larger.
    """
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
    recompute: int  # the largest checkpointed block's own saved tensors
    weight_copies: int  # autocast's 16-bit copies of parameters kept for backward
    largest_saved: int  # the largest single saved storage (backward's working set)
    recompute_flops: float  # forward FLOPs of the checkpointed blocks, per micro-batch
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
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten(obj)[0]:
        if isinstance(leaf, torch.Tensor):
            yield leaf


class _CudaFp32Ops(torch.overrides.TorchFunctionMode):
    """CUDA autocast's fp32 ops, which CPU autocast leaves in 16-bit.

    The trace runs under CPU autocast (fake tensors cannot be CUDA ones here);
    on CUDA, norms and softmax take fp32 inputs (a new fp32 copy, which they
    keep) and give fp32 outputs. Casting their input here reproduces that.
    """

    def __init__(self) -> None:
        super().__init__()
        f = torch.nn.functional
        names = ("layer_norm", "group_norm", "rms_norm", "softmax", "log_softmax", "softplus")
        self.ops: set[Callable[..., Any]] = {getattr(f, n) for n in names if hasattr(f, n)}
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
    the trace runs under CPU autocast in bf16, with CUDA's fp32 norms and softmax
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


def _trace(
    workload: Workload,
    micro_batch: int,
    amp: bool,
    device_type: str,
    every: int | None,
    fake: bool,
) -> Trace:
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    mode = FakeTensorMode() if fake else None
    device = "cpu" if fake else "meta"
    with mode if mode is not None else torch.device("meta"):
        model = workload.build_model()
        model.train()
        try:
            batch = workload.batch(micro_batch, 0, device)
        except Exception:
            if mode is None:
                raise
            # Some batch sources cannot run on fake tensors: build it for real.
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                real = workload.batch(micro_batch, 0, "cpu")
            from torch.utils._pytree import tree_map

            batch = tree_map(
                lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, real
            )

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
    owners: dict[int, tuple[int, set[int | None]]] = {}
    copies: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        held.append(t)
        key = _storage_key(t)
        if key in excluded:
            return t
        if key in copies or _is_parameter_copy(t, param_ids):
            copies[key] = t.untyped_storage().nbytes()
            return t
        entry = owners.setdefault(key, (t.untyped_storage().nbytes(), set()))
        entry[1].add(current[-1] if current else None)
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp and fake)
    fp32_ops = _CudaFp32Ops() if amp and fake and device_type == "cuda" else None
    with contextlib.ExitStack() as stack:
        if mode is not None:
            stack.enter_context(mode)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        if fp32_ops is not None:
            stack.enter_context(fp32_ops)
        stack.enter_context(autocast)
        held.append(workload.loss(model, batch))  # the graph, alive until we are done
    for h in handles:
        h.remove()

    ckpt = set(checkpointed_blocks(len(blocks), every))
    activations = other = 0
    kept: set[int] = set()
    for key, (n, who) in owners.items():
        live = who - ckpt
        if not live:
            continue  # saved only inside checkpointed blocks: not kept
        kept.add(key)
        if not blocks or any(o is not None for o in live):
            activations += n
        else:
            other += n
    for i in sorted(ckpt):
        for key, n in block_inputs.get(i, ((), {}, {}))[2].items():
            if key not in kept and key not in excluded:
                kept.add(key)
                activations += n
    per_block = {
        i: sum(n for n, who in owners.values() if i in who) for i in ckpt
    }
    recompute = max(per_block.values(), default=0)
    largest = max((n for n, _ in owners.values()), default=0)

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
        recompute=recompute,
        weight_copies=sum(copies.values()),
        largest_saved=largest,
        recompute_flops=recompute_flops,
        notes=notes,
    )


# --- the estimate ---------------------------------------------------------------


def layout_assumptions(layout: Layout) -> list[str]:
    notes = []
    if layout.data > 1:
        notes.append(
            f"Data parallel over {layout.data} ranks replicates parameters, gradients and "
            "optimizer state (no ZeRO); communication buckets are not counted."
        )
    if layout.tensor > 1 or layout.pipeline > 1:
        notes.append(
            f"Tensor ({layout.tensor}) and pipeline ({layout.pipeline}) splits are not "
            "modelled: memory is given for a device holding the whole model."
        )
    return notes


def estimate(
    plan: Plan,
    workload: Workload,
    env: RuntimeEnv,
    peak_flops: float | None = None,
) -> Estimate:
    """Predicted per-device peak memory and step time of `plan`; nothing is run.

    `peak_flops` is the device's peak FLOP rate (harness.peaks); without it the
    step time is None.
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
    if cfg.compile:
        assumptions.append(
            "torch.compile is estimated as eager: its partitioner usually saves fewer "
            "activations, so the estimate is high."
        )
    assumptions += layout_assumptions(plan.layout)

    shape = workload.shape
    block_terms: dict[str, int] = {}
    recompute_flops_per_sample = 0.0
    # Activations and gradients live when a checkpointed block is rebuilt
    # (without the rebuilt block's own); by default all stored activations.
    recompute_moment: int | None = None
    if shape is not None:
        dropout = shape.dropout > 0
        kind = attention_kind(cfg.attention, env.device_type, dropout)
        widths = widths_for(amp, env.device_type)
        block_terms = block_activation_terms(
            shape,
            b,
            widths,
            attention=kind,
            dropout=dropout,
            # memory-efficient attention (CUDA's fused kernel for fp32) pads rows to 32
            logsumexp_rows=(
                32 * math.ceil(shape.seq_len / 32)
                if env.device_type == "cuda" and not amp
                else None
            ),
        )
        per_block = sum(block_terms.values())
        ckpt = checkpointed_blocks(shape.layers, cfg.checkpoint_every)
        stored_input = widths.resid * shape.seq_len * b * shape.hidden
        memory["activations"] = len(ckpt) * stored_input + (shape.layers - len(ckpt)) * per_block
        memory["other_activations"] = sum(outside_block_terms(shape, b, widths, dropout).values())
        memory["logits"] = logits_bytes(shape, b)
        memory["backward_working"] = block_backward_working_bytes(
            block_terms, shape, b, widths, kind
        )
        if ckpt:
            memory["recompute"] = per_block
            # Backward reaches the last checkpointed block j first: the blocks after
            # it are done (their activations freed, their gradients made), the
            # blocks before it still hold theirs.
            j = ckpt[-1]
            block_params = facts.block_parameters or 4 * shape.hidden**2 + 2 * shape.hidden * (
                shape.ffn_hidden
            )
            recompute_moment = (
                sum(stored_input if i in ckpt else per_block for i in range(j + 1))
                + max(0, facts.trainable_bytes - (j + 1) * block_params * round(width))
            )
        if amp:
            memory["autocast_weight_copies"] = 2 * facts.parameters
        recompute_flops_per_sample = len(ckpt) * block_forward_flops_per_sample(
            shape, facts.block_parameters
        )
        sbh = shape.seq_len * b * shape.hidden
        assumptions += [
            f"Transformer activations per block follow Korthikanti et al. (2022) eq. 1 term "
            f"by term, adapted to what PyTorch keeps on {env.device_type}: "
            f"{per_block:,} bytes per block ({per_block / sbh:.2f}·s·b·h) with "
            f"{'16-bit' if amp else 'fp32'} activations, an fp32 residual stream "
            f"(LayerNorm inputs), {kind} attention"
            + (f" and dropout {shape.dropout:g}" if dropout else " and no dropout")
            + "; see block_terms.",
            "The blocks are pre-LayerNorm GPT blocks (LayerNorm, one QKV projection, "
            "attention, output projection; LayerNorm, FC, GELU, FC); tensors that do not "
            "grow with the batch are left out.",
            "The language-model loss peaks at 12·b·s·V bytes at the start of backward "
            "(the fp32 log-softmax output and two fp32 gradients of its size).",
        ]
        if amp:
            assumptions.append(
                "Autocast's 16-bit weight copies are counted at 2 bytes for every parameter "
                "(an upper bound: norms and position embeddings are not cast)."
            )
        if kind == "fused":
            assumptions.append(
                "SDPA runs a fused kernel (flash / memory-efficient): no s² terms, a fp32 "
                "log-sum-exp per row and head instead."
            )
        elif kind == "math":
            assumptions.append(
                "SDPA on CPU with dropout runs its math path, which keeps fp32 scores."
            )
    else:
        trace = trace_activations(workload, b, amp, env.device_type, cfg.checkpoint_every)
        memory["activations"] = trace.activations
        memory["other_activations"] = trace.other_activations
        memory["recompute"] = trace.recompute
        memory["backward_working"] = trace.largest_saved
        memory["autocast_weight_copies"] = trace.weight_copies
        recompute_flops_per_sample = trace.recompute_flops / b
        assumptions.append(
            "Activations are counted by tracing one forward pass on fake tensors: what "
            "autograd saves, once per storage, parameters, buffers and autocast weight "
            "copies apart. Backward's working set is taken as the largest saved tensor "
            "(the gradients of an op's output and input, while what follows is freed)."
        )
        if amp:
            assumptions.append(
                "Under amp the trace runs CPU autocast in bf16"
                + (
                    ", with CUDA's fp32 norms and softmax emulated."
                    if env.device_type == "cuda"
                    else "."
                )
            )
        assumptions += trace.notes
        if cfg.checkpoint_every and facts.blocks is None:
            assumptions.append(
                "The model has no `blocks` ModuleList: checkpointing is not modelled."
            )

    if cfg.checkpoint_every:
        layers = shape.layers if shape is not None else (facts.blocks or 0)
        ckpt = checkpointed_blocks(layers, cfg.checkpoint_every)
        assumptions.append(
            f"Checkpointing every {cfg.checkpoint_every} block(s): blocks 0, "
            f"{cfg.checkpoint_every}, ... ({len(ckpt)} of {layers}) keep only their input; "
            "one is rebuilt at a time in backward (recompute), adding one forward of each "
            "checkpointed block to the step's FLOPs."
        )

    # The moments of a step. Gradients are None at the start of backward
    # (zero_grad(set_to_none=True)) unless earlier micro-steps made them.
    grads_held = memory["gradients"] if plan.accumulation_steps > 1 else 0
    saved = memory["autocast_weight_copies"] + memory["activations"] + memory["other_activations"]
    # The loss's transient comes first in backward and is gone before any block's.
    working = max(memory["logits"], memory["backward_working"])
    phases = {"backward_start": saved + working + grads_held}
    if memory["recompute"]:
        live = memory["activations"] if recompute_moment is None else recompute_moment
        phases["checkpoint_recompute"] = (
            memory["autocast_weight_copies"]
            + memory["other_activations"]
            + live
            + memory["recompute"]
            + memory["backward_working"]
            + grads_held
        )
    phases["optimizer_step"] = memory["gradients"] + memory["optimizer_temporaries"]
    persistent = memory["parameters"] + memory["optimizer_state"] + memory["buffers"]
    peak = persistent + max(phases.values())
    assumptions.append(
        "Peak = parameters, optimizer state and buffers, plus the largest moment of a step: "
        "backward (activations with the loss's or a block's working set, gradients not yet "
        "allocated"
        + (", except those of earlier micro-steps" if grads_held else "")
        + "), the rebuild of a checkpointed block, or the optimizer step (gradients and "
        "its temporaries). Allocator fragmentation and caching are not counted; "
        "upper_bound_bytes adds every component instead."
    )

    flops_per_sample = float(workload.flops_per_sample())
    flops_per_step = (flops_per_sample + recompute_flops_per_sample) * plan.batch_size
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
        block_terms=block_terms,
        assumed_mfu=mfu,
    )
