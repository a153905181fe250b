"""A plan dict (a record's "plan", partial or with every setting written out) read
into the few numbers the surfaces need, with each strategy's defaults filled in as
the strategies define them (strategies/*.py), so that two spellings of one
configuration are one Config (and draw the same noise)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any


class Unsupported(Exception):
    """A plan the surface cannot model (another workload, a strategy it does not know)."""


KNOWN = {"amp", "fused", "checkpoint", "lamb", "ddp", "zero", "pipeline", "tensor",
         "accumulation"}


@dataclass(frozen=True)
class Config:
    # the GPT workload (training_harness.workloads.gpt.GPTConfig)
    layers: int
    heads: int
    hidden: int
    seq: int
    vocab: int
    ffn: int
    tied: bool
    # layout and batch
    data: int
    pipeline: int
    tensor: int
    micro: int
    batch: int  # the global batch: samples per optimizer step
    # strategies
    dtype: str  # "fp32" (no amp), "bf16", "fp16"
    attention: str  # "explicit" or "sdpa"
    optimizer: str  # "adamw" or "lamb"
    opt_impl: str  # "default", "foreach", "fused", "triton"
    compile: bool  # torch.compile of each block
    layernorm: str  # "eager", "compile", "triton"
    gelu: str
    cross_entropy: str
    checkpoint_every: int  # 0: no checkpointing
    dp: str  # "none", "ddp", "zero"
    zero_stage: int
    zero_offload: bool
    zero_mixed: bool
    bucket_mb: float
    compression: str
    schedule: str
    virtual: int
    tp_mlp: bool
    # the run
    warmup: int
    steps: int
    timeout_s: float

    @property
    def world(self) -> int:
        return self.data * self.pipeline * self.tensor

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank."""
        return max(1, self.batch // (self.micro * self.data))

    @property
    def checkpointed(self) -> float:
        """The share of blocks checkpointed: blocks 0, k, 2k ... of `layers`."""
        if not self.checkpoint_every:
            return 0.0
        return -(-self.layers // self.checkpoint_every) / self.layers

    def key(self) -> str:
        """The configuration, for seeding its noise (the run's length left out)."""
        table = dataclasses.asdict(self)
        for k in ("warmup", "steps", "timeout_s"):
            table.pop(k)
        return json.dumps(table, sort_keys=True)


def unit(key: str, repeat: int, what: str) -> float:
    """A number in [0, 1), fixed by (configuration, repeat, what it is for)."""
    digest = hashlib.sha256(f"{key}|{repeat}|{what}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def read(plan: dict[str, Any]) -> Config:
    w = dict(plan.get("workload") or {})
    if isinstance(plan.get("workload"), str):  # the dataclass form: name + workload_args
        w = {"name": plan["workload"], **(plan.get("workload_args") or {})}
    if w.get("name", "gpt") != "gpt":
        raise Unsupported(f"this surface models the gpt workload, not {w.get('name')!r}")
    s = {k: dict(v or {}) for k, v in (plan.get("strategies") or {}).items()}
    if unknown := sorted(s.keys() - KNOWN):
        raise Unsupported(f"strategies the surface does not model: {', '.join(unknown)}")
    lay = plan.get("layout") or {}
    data, pipe, tens = (int(lay.get(k, 1)) for k in ("data", "pipeline", "tensor"))
    micro = int(plan.get("micro_batch_size", 8))
    batch = int(plan.get("global_batch_size") or micro * data)
    fused = s.get("fused")
    amp = s.get("amp")
    zero, ddp, pp = s.get("zero"), s.get("ddp"), s.get("pipeline") or {}
    ck = s.get("checkpoint")
    return Config(
        layers=int(w.get("layers", 4)), heads=int(w.get("heads", 4)),
        hidden=int(w.get("hidden", 256)), seq=int(w.get("seq_len", 256)),
        vocab=int(w.get("vocab", 8192)), ffn=int(w.get("ffn_mult", 4)),
        tied=bool(w.get("tie_weights", True)),
        data=data, pipeline=pipe, tensor=tens, micro=micro, batch=batch,
        dtype=(amp.get("dtype", "bf16") if amp is not None else "fp32"),
        attention=(fused.get("attention", "sdpa") if fused is not None
                   else w.get("attention", "explicit")),
        optimizer="lamb" if "lamb" in s else "adamw",
        opt_impl=fused.get("optimizer", "fused") if fused is not None else "default",
        compile=bool(fused.get("compile", False)) if fused is not None else False,
        layernorm=fused.get("layernorm", "eager") if fused is not None else "eager",
        gelu=fused.get("gelu", "eager") if fused is not None else "eager",
        cross_entropy=fused.get("cross_entropy", "eager") if fused is not None else "eager",
        checkpoint_every=int(ck.get("every", 1)) if ck is not None else 0,
        dp="zero" if zero is not None else "ddp" if ddp is not None else "none",
        zero_stage=int(zero.get("stage", 2)) if zero is not None else 0,
        zero_offload=bool(zero.get("offload", False)) if zero is not None else False,
        zero_mixed=bool(zero.get("mixed_precision", True)) if zero is not None else False,
        bucket_mb=float(ddp.get("bucket_cap_mb", 25.0)) if ddp is not None else 25.0,
        compression=str(ddp.get("compression", "none")) if ddp is not None else "none",
        schedule=str(pp.get("schedule", "1f1b")), virtual=int(pp.get("virtual_stages", 1)),
        tp_mlp=bool((s.get("tensor") or {}).get("mlp", True)),
        warmup=int(plan.get("warmup_steps", 3)), steps=int(plan.get("steps", 10)),
        timeout_s=float(plan.get("timeout_s", 900.0)),
    )
