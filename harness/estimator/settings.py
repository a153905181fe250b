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
            optimizer=optimizer,
            optimizer_impl=fused.optimizer if fused is not None else "default",
            cross_entropy=fused.cross_entropy if fused is not None else "eager",
            max_grad_norm=lamb.max_grad_norm if lamb is not None else 0.0,
            distributed=tuple(sorted(n for n in parsed if get(n).distributed)),
            averaging="averaging" in parsed,
            lora=parsed.get("lora"),
            float8=parsed["float8"].recipe if "float8" in parsed else None,
            channels_last="channels_last" in parsed,
            parallel=Parallelism.of(plan, parsed),
        )


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
    compression: str = "none"  # DDP's gradients on the wire
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
