"""What an estimate reads from a plan: its strategies' settings and how it splits the work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training_harness.core.plan import Plan


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
    optimizer: str  # "adamw" | "lamb" | "lars" | "muon"
    optimizer_impl: str  # "default" | "foreach" | "fused" | "triton"
    cross_entropy: str  # "eager" | "compile" | "triton"
    max_grad_norm: float  # LAMB's clipping (0: off)
    distributed: tuple[str, ...]  # distributed strategies in the plan
    parallel: Parallelism
    averaging: bool = False  # weight averaging keeps a copy of the trainable parameters
    lora: Any = None  # strategies.lora.LoraSettings: only its adapters train
    float8: str | None = None  # torchao float8's recipe; estimated as the plan without it
    channels_last: bool = False  # the same values in NHWC: estimated as the plan without it
    compile_mode: str = "default"  # fused's torch.compile mode (CUDA graphs in two of them)
    # fused linear_cross_entropy: the loss holds one chunk of logits, not all of them
    linear_cross_entropy: bool = False
    sdpa_backend: str = "auto"  # fused's SDPA kernel: math keeps the scores, the others not
    # strategies.sparse_attention's Pattern: flex keeps no scores; FLOPs at its blocks' share
    sparse_attention: Any = None
    # strategies.liger's patches on; its fused linear cross-entropy sets
    # linear_cross_entropy too (the same chunked loss), the rest estimated as without them
    liger: tuple[str, ...] = ()

    @classmethod
    def of(cls, plan: Plan) -> Settings:
        from training_harness.strategies.registry import get

        parsed = {
            name: get(name).parse(table, f"[strategies.{name}]")
            for name, table in plan.strategies.items()
        }
        amp, ckpt, fused, lamb = (parsed.get(n) for n in ("amp", "checkpoint", "fused", "lamb"))
        optimizer = next((n for n in ("lamb", "lars", "muon") if n in parsed), "adamw")
        return cls(
            amp=amp.dtype if amp is not None else None,
            # selective checkpointing keeps every matmul's output: counted as none
            # (an upper bound: it stores less than no checkpointing)
            checkpoint_every=(ckpt.every if ckpt is not None and ckpt.policy == "full"
                              else None),
            fused_attention=fused.attention if fused is not None else None,
            compile=bool(fused is not None and fused.compile),
            compile_mode=fused.compile_mode if fused is not None else "default",
            optimizer=optimizer,
            optimizer_impl=fused.optimizer if fused is not None else "default",
            cross_entropy=fused.cross_entropy if fused is not None else "eager",
            max_grad_norm=lamb.max_grad_norm if lamb is not None else 0.0,
            distributed=tuple(sorted(n for n in parsed if get(n).distributed)),
            averaging="averaging" in parsed,
            lora=parsed.get("lora"),
            float8=parsed["float8"].recipe if "float8" in parsed else None,
            channels_last="channels_last" in parsed,
            linear_cross_entropy=bool(fused is not None and fused.linear_cross_entropy)
            or "fused_linear_cross_entropy" in _liger(parsed),
            liger=_liger(parsed),
            sdpa_backend=fused.sdpa_backend if fused is not None else "auto",
            sparse_attention=_sparse_pattern(plan),
            parallel=Parallelism.of(plan, parsed),
        )


def _liger(parsed: dict) -> tuple[str, ...]:
    """The Liger patches the plan turns on (strategies.liger), in its settings' order."""
    liger = parsed.get("liger")
    return tuple(k for k, v in vars(liger).items() if v) if liger is not None else ()


def _sparse_pattern(plan: Plan) -> Any:
    table = plan.strategies.get("sparse_attention")
    if table is None:
        return None
    from training_harness.strategies.sparse_attention import plan_pattern

    return plan_pattern(table, plan.workload, plan.workload_args)


@dataclass(frozen=True)
class Parallelism:
    """How the plan's strategies split the work over its layout's ranks.

    A layout dimension that no strategy uses replicates the model (the plan's
    checks refuse such layouts; the estimate takes them as replicas).
    """

    data: int = 1  # data-parallel ranks
    zero: int = 0  # ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters
    offload: bool = False  # zero: shards on the CPU
    fsdp_mixed: bool = False  # zero 2/3 with amp: FSDP computes with 16-bit parameters
    ddp: bool = False  # a DDP reducer holds the gradients in buckets (ddp, zero stage 1)
    bucket_cap_mb: float = 25.0
    bucket_view: bool = True  # gradients are views of DDP's buckets
    compression: str = "none"  # DDP's gradients on the wire (estimator.compression)
    powersgd_rank: int = 1  # compression "powersgd": its factors' rank
    start_powersgd_iter: int = 0  # its steps of plain all-reduce (the estimate is after)
    pipeline: int = 1  # pipeline ranks
    virtual: int = 1  # stages per pipeline rank
    schedule: str = "1f1b"
    microbatches: int = 1  # micro-steps per step (the plan's accumulation steps)
    no_sync: bool = True  # gradients reduced on the last micro-step only
    tensor: int = 1  # tensor-parallel ranks
    tensor_mlp: bool = True  # the MLP is split too, not only attention

    @classmethod
    def of(cls, plan: Plan, parsed: dict) -> Parallelism:
        layout = plan.layout
        ddp, zero = parsed.get("ddp"), parsed.get("zero")
        pipe, tensor = parsed.get("pipeline"), parsed.get("tensor")
        stage = zero.stage if zero is not None else 0
        return cls(
            data=layout.data,
            zero=stage,
            offload=bool(zero is not None and zero.offload),
            fsdp_mixed=bool(stage >= 2 and zero.mixed_precision and "amp" in parsed),
            ddp=ddp is not None or stage == 1,
            bucket_cap_mb=ddp.bucket_cap_mb if ddp is not None else 25.0,
            bucket_view=ddp.gradient_as_bucket_view if ddp is not None else True,
            compression=ddp.compression if ddp is not None else "none",
            powersgd_rank=ddp.powersgd_rank if ddp is not None else 1,
            start_powersgd_iter=(ddp.start_powersgd_iter if ddp is not None
                                 and ddp.compression == "powersgd" else 0),
            pipeline=layout.pipeline if pipe is not None else 1,
            virtual=pipe.virtual_stages if pipe is not None else 1,
            schedule=pipe.schedule if pipe is not None else "1f1b",
            microbatches=plan.accumulation_steps,
            no_sync=getattr(parsed.get("accumulation"), "sync_last_only", True),
            tensor=layout.tensor if tensor is not None else 1,
            tensor_mlp=tensor.mlp if tensor is not None else True,
        )

    @property
    def fsdp(self) -> bool:
        return self.zero >= 2


def checkpointed_blocks(layers: int, every: int | None) -> list[int]:
    """Indices of the checkpointed blocks: 0, k, 2k, ... (ceil(layers / k) of them),
    as strategies.checkpoint wraps them."""
    if not every:
        return []
    return list(range(0, layers, every))
