"""Peak memory of the GPT workload on one H100 (the assumptions: h100.py's docstring; the
figures a family of surfaces varies come in an assumptions.Assumptions, BASE by default)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.benchmarks.surfaces.assumptions import BASE, Assumptions
from tests.benchmarks.surfaces.config import Config
from tests.benchmarks.surfaces.gpt_shape import Stage, stages
from tests.benchmarks.surfaces.gpt_time import fsdp_mixed
from tests.benchmarks.surfaces.hardware import CAPACITY, GIB

OOM_SLACK = BASE.oom_slack  # fragmentation the allocator cannot give back, even after emptying it


@dataclass
class Memory:
    allocated: float  # peak bytes in tensors on the busiest rank
    logits_share: float  # of it, the loss's logits (large, short-lived blocks)
    beside: float  # context, workspaces, NCCL buffers: held outside the allocator
    a: Assumptions = BASE

    @property
    def oom(self) -> bool:
        return self.beside + self.allocated * (1 + self.a.oom_slack) > CAPACITY

    def held(self, cache: float) -> int:
        """What the device held: the allocator keeps `cache` (a share) above its peak."""
        return int(min(CAPACITY, self.beside + self.allocated * (1 + cache)))

    def cache(self, c: Config) -> float:
        """The caching allocator's reserve above the peak: more with huge transient
        logits, and with FSDP's gather/free cycles."""
        extra = 0.05 if c.dp == "zero" and c.zero_stage == 3 else 0.0
        return min(0.35, self.a.cache_base + 0.45 * self.logits_share + extra)


def stage_bytes(c: Config, st: Stage, a: Assumptions = BASE) -> tuple[float, float]:
    amp = c.dtype != "fp32"
    d = c.data if c.dp != "none" else 1
    zs = c.zero_stage if c.dp == "zero" else 0
    m = c.accumulation
    n = st.params
    state = 0.0 if c.zero_offload else (
        4 * n / (d if zs == 3 else 1)  # fp32 parameters
        + 8 * n / (d if zs >= 1 else 1))  # Adam's (or LAMB's) two moments
    # gradients, fp32: sharded by ZeRO-2/3 only when no micro-step skips the reduction
    # (under no_sync FSDP2 keeps the unsharded gradients across micro-steps)
    state += 4 * n / (d if zs >= 2 and m == 1 else 1)
    n_opt = n / (d if zs >= 1 else 1)
    if c.opt_impl in ("default", "foreach") or (c.optimizer == "lamb" and c.opt_impl != "triton"):
        state += 4 * n_opt  # multi-tensor temporaries (the denominators, the updates)
    width = 2 if fsdp_mixed(c) else 4
    if zs == 2:
        state += width * n  # gathered in forward, kept until backward
    elif zs == 3:
        state += 3 * width * n / max(1, st.layers)  # a block, its prefetch, its gradient
    elif amp:
        state += 2 * n  # autocast's 16-bit weight copies, kept for backward
    # activations (Korthikanti et al. 2022: sbh(34 + 5as/h) bytes per layer in 16 bits)
    t = c.tensor
    sbh = c.micro * c.seq * c.hidden
    full = sbh * ((10 + 26 / t) if amp else (20 + 46 / t))
    scores = c.micro * c.heads / t * c.seq**2
    if c.attention == "explicit":  # the probabilities (fp32, and autocast's 16-bit copy)
        full += scores * (6 if amp else 4)
    ck = c.checkpointed
    kept = sbh * (2 if amp else 4)  # a checkpointed block keeps its input only
    per_micro = st.layers * ((1 - ck) * full + ck * kept)
    # one block's scores, mask and softmax gradient pass through backward at a time
    passing = scores * 12 if c.attention == "explicit" else 0.0
    if c.pipeline == 1:
        in_flight = 1
    elif c.schedule == "gpipe":
        in_flight = m  # every micro-batch's forward before any backward
    else:
        in_flight = min(m, c.pipeline - st.index)  # 1F1B: p - i on stage i
    acts = per_micro * in_flight + (full if ck else 0.0) + passing  # + one recomputed
    acts *= a.activations
    logits = 0.0
    if st.last:
        per = c.micro * c.seq * c.vocab
        saved = {"eager": 6 if amp else 8, "compile": 4 if amp else 6, "triton": 2 if amp else 4}
        passing = {"eager": 4, "compile": 2, "triton": 0}
        logits = per * (saved[c.cross_entropy] * (in_flight if c.schedule == "gpipe" else 1)
                        + passing[c.cross_entropy])
        if c.cross_entropy == "triton":
            logits += 0.25 * GIB  # one chunk
    allocated = state + acts + logits
    return allocated, logits / allocated


def memory(c: Config, a: Assumptions = BASE) -> Memory:
    allocated, share = max(stage_bytes(c, st, a) for st in stages(c))
    beside = a.context
    if c.compile or {c.layernorm, c.gelu, c.cross_entropy, c.opt_impl} & {"compile", "triton"}:
        beside += a.compiled_extra
    if c.world > 1:
        beside += a.nccl_buffers
    return Memory(allocated, share, beside, a)
