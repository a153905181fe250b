"""Simulated H100 surfaces for the GPT studies: `gpt2_small_1gpu` (studies/gpt2-small-1gpu.toml,
one H100 SXM 80GB) and `gpt_1b_8gpu` (studies/gpt-1b-8gpu.toml, one node of 8 H100 SXM on
NVLink 4 / NVSwitch). Each is `function(plan: dict, repeat: int) -> {"status": "ok" | "oom" |
"failed", "samples_per_s", "wall_s", "peak_memory_bytes", ...}`, deterministic in (plan,
repeat); beside those four it gives "reason", "startup_s", "compile_s", "step_time_s" and,
when it ran, "allocated_bytes", "reserved_bytes", "device_base_bytes" (what a GPU trial's
record holds). `function.truth(plan)` gives the noise-free figures (the replay's best).
They model any plan of the `gpt` workload; the rest of this docstring is their truth.

Hardware (hardware.py)
  H1  Dense peaks of an H100 SXM (NVIDIA datasheet): bf16 = fp16 = 989.4 TFLOP/s, TF32
      494.7, fp32 66.9. A trial without amp runs fp32 on the CUDA cores: torch leaves TF32
      off for matmuls and the harness does not turn it on (harness/measure/peaks.py).
  H2  HBM3 3.35 TB/s (datasheet); element-wise kernels stream at 80% of it, the
      optimizer step at 85%.
  H3  Capacity 79.18 GiB, what torch reports for the 80GB part (docs/benchmarks/
      gpu_h100-80gb-hbm3_2026-11-23.md). Beside its tensors a process holds 0.75 GiB
      (CUDA context + cuBLAS/cuDNN workspaces: 0.51 GiB context measured there, the rest
      the held-minus-reserved gap), +0.25 GiB with Inductor/Triton kernels, +0.5 GiB of NCCL
      buffers on a rank with peers: about 1 GiB.
  H4  Collectives: NCCL bus bandwidth 360 GB/s over NVLink 4 / NVSwitch for large
      messages (assumed: the figure commonly reported for nccl-tests all_reduce_perf on
      8 H100 SXM without NVLS; NVLink 4 is 450 GB/s per direction per GPU), half of it
      at 2 MB messages, 20 us latency each; all-reduce moves 2(n-1)/n of its buffer per
      rank, all-gather and reduce-scatter (n-1)/n. Point-to-point 400 GB/s one way, 30 us.
  H5  GEMM efficiency (share of H1's peak): 16-bit 0.74 x w/(w+200) x tok/(tok+1024), fp32
      0.78 x w/(w+64) x tok/(tok+256), w the GEMM's width (hidden / tensor degree), tok
      the tokens per micro-batch. At GPT-2 small's width this caps bf16 at ~0.59 (580
      TFLOP/s; an 8192^3 bf16 GEMM measured 715-798 on these machines) and fp32 at 0.72
      (48 of the 52 TFLOP/s measured). Small micro-batches starve the tensor cores.
Time of one micro-batch's forward and backward (gpt_time.py)
  T1  Block GEMMs 6 x tokens x (4+2f)h^2 per layer (f = 4), split by the tensor degree; the
      LM head 6 x tokens x h x vocab, never split (tensor parallel leaves it whole).
  T2  Attention: SDPA runs flash (16-bit, 42% of peak) or memory-efficient (fp32, 55%)
      kernels on the causal half of 12 x seq x h FLOPs per token per layer; eager
      ("explicit") attention does all of them as batched GEMMs at 0.75 x H5, and moves
      44 bytes per score (s^2 per head) through memory for scores, mask, softmax (fp32 under
      autocast) and their backward; torch.compile fuses that to 45%.
  T3  Other element-wise work (norms, GELU, residuals, copies): (25 + 50/t) hidden-sized
      elements per token per block, at 3 bytes each under autocast (16-bit and fp32 mixed)
      or 4 in fp32, streamed per H2. Compiling the block cuts it to 40%; without it, a
      compiled or Triton LayerNorm saves 40% of the norms' 16, bias+GELU 35% of the MLP's 24/t.
  T4  Loss: bytes per logit (tokens x vocab) 36 eager under autocast (upcast, log_softmax,
      its backward, the downcast), 24 eager fp32, 14 compiled, 8 with the chunked in-place
      Triton kernel. The embedding's dense gradient writes 8 x vocab x h bytes.
  T5  Autocast casts each fp32 weight once per micro-step (6 bytes per parameter; with
      ZeRO-2/3's mixed precision the shard, before gathering it).
  T6  Recompute: a checkpointed block's forward (a third of its forward+backward) runs
      again; every k-th block is checkpointed (checkpoint.every = k), ceil(L/k)/L of them.
  T7  Launch-bound: the CPU issues each op: eager forward op 12 us, backward node 6 us,
      per block (24 + 6 explicit attention + 6 autocast) forward ops, (20 + 5 + 3) backward;
      a compiled block is ~30 kernels at 5 us plus 2 graph calls at 40 us (no CUDA graphs:
      `block.compile()` is Inductor's default mode); a Triton kernel inside a compiled block
      breaks its graph (+0.1 ms); DTensor dispatch on tensor-parallel blocks +0.5 ms each
      (eager); FSDP2 hooks 0.25 ms (ZeRO-2) / 0.33 ms (ZeRO-3) per block; the head and loss
      0.25 ms; a pipeline schedule 0.4 ms per micro-batch. A micro-step takes
      max(GPU, CPU) + 5% of the smaller: small micro-batches are launch-bound.
  T8  Tensor parallel: Megatron-style all-reduces of the activations (tokens x h x 2 bytes,
      4 in fp32), two per block forward and two backward (one each for attention only,
      tensor.mlp = false), again for recomputed blocks; on the critical path.
Time of one optimizer step (gpt_time.py)
  S1  Micro-batches: global batch / (micro x data); each data rank runs them in turn.
  S2  Pipeline (GPipe, 1F1B): (m + p - 1) micro-batch slots of the slowest stage, i.e. a
      bubble (p-1)/(m+p-1); interleaved 1F1B with v stages per rank (p-1)/v slots;
      activations and gradients cross each stage boundary, half of it exposed.
  S3  Data parallel, DDP and ZeRO-1: fp32 gradients (half with compression) all-reduced in
      buckets of bucket_cap_mb (ZeRO-1: DDP's 25) on the last micro-step only (no_sync
      before it), overlapping 90% of its backward, at least one bucket exposed; ZeRO-1's
      ZeroRedundancyOptimizer then broadcasts each rank's updated shard (4 bytes per
      parameter at half the bus bandwidth, exposed).
  S4  ZeRO-2/3 (FSDP2): per block per micro-step an all-gather of the parameters (16-bit
      with amp's mixed precision, else fp32) before forward, and ZeRO-3 again before
      backward, prefetched under 85% of the compute; fp32 gradients reduce-scattered on
      the last micro-step under 90% of its backward.
  S5  Optimizer: AdamW reads and writes params, grads and two moments: 28 bytes per
      parameter fused, 30 our Triton kernel, 76 foreach (torch's "default" on CUDA is
      foreach); LAMB 100 (40 Triton) for its norms; over the rank's parameters (a ZeRO
      rank's shard), at 85% of H2. CPU: fused 0.3 ms, foreach 1.2 ms, LAMB 2.5 ms, LAMB
      "default" a Python loop of 15 ops per tensor. fp16's GradScaler: +8 bytes per
      gradient and a 0.3 ms sync. ZeRO offload: CPU Adam at 0.5 G params/s + PCIe 25 GB/s.
  S6  Per step 0.5 ms (zero_grad, timing), +0.2 ms with several ranks.
Memory on the busiest rank (gpt_memory.py)
  M1  fp32 parameters 4 B (ZeRO-3: / data), Adam's moments 8 B (ZeRO >= 1: / data), fp32
      gradients 4 B (ZeRO-2/3: / data, but only with one micro-batch per step: under
      no_sync FSDP2 keeps unsharded gradients), foreach temporaries 4 B per optimizer
      parameter; autocast's 16-bit weight copies 2 B; ZeRO-2 holds the gathered
      parameters from forward to backward, ZeRO-3 three blocks' worth.
  M2  Activations per block per micro-batch (Korthikanti et al. 2022, "Reducing
      Activation Recomputation", sbh(34 + 5as/h) in 16 bits): s.b.h x (10 + 26/t) bytes
      under autocast, (20 + 46/t) in fp32 (no dropout masks: dropout is 0); eager
      attention keeps heads/t x s^2 x b probabilities, 6 bytes each under autocast (fp32
      softmax + the 16-bit copy AV's matmul saves), 4 in fp32, and 12 bytes per score pass
      through one block's backward at a time; a checkpointed block keeps its input only
      (2 or 4 bytes x s.b.h), and one block is recomputed at a time in backward.
      In flight: 1; GPipe m; 1F1B p - i on stage i.
  M3  Logits (tokens x vocab) kept for backward: 6 B eager under autocast (16-bit logits
      + fp32 log-probabilities), 8 fp32, 4/6 compiled, 2/4 Triton (in place; plus a
      0.25 GiB chunk); passing at the start of backward: 4 eager, 2 compiled, 0 Triton.
      With M1-M2, GPT-2 small at micro-batch 64 (bf16, SDPA, fused AdamW) peaks at 53.0
      GiB allocated and 71.9 held; the H100 measured 53.0 and 71.46 (the doc in H3).
  M4  The caching allocator holds 8% above the peak, + 0.45 x the logits' share of it
      (huge short-lived blocks fragment it), +5% under ZeRO-3, at most 35% (the doc in H3:
      53.0 GiB allocated, 70.7 reserved); +-2 points of noise per (plan, repeat).
      peak_memory_bytes = H3's beside + that, at most the capacity.
  M5  Out of memory when beside + allocated x 1.03 exceeds the capacity: the allocator
      empties its cache and retries before it gives up, so a trial may hold up to all
      79.18 GiB and run (over a 0.9 budget), as the measured 71.46 GiB one did.
Wall-clock seconds of a trial, and failures (this module)
  W1  Start: 9 s on one GPU (fork from the rank server, build, CUDA), 22 s on eight (NCCL,
      building 1.4B parameters) +4 s with ZeRO-3, tensor or pipeline parallel; the first
      step +1.5 s (8 GPUs: +4 s: cuBLAS heuristics, NCCL's first collectives); 2 s to end.
      Each +-10% per (plan, repeat).
  W2  torch.compile of the blocks: 62 s for GPT-2 small's blocks (hidden <= 1024), 75 s for
      larger ones, +10 s with checkpointing, +15 s tensor parallel, +5 s FSDP, +5 s
      pipeline (the issue's "compile alone takes about 70 s"); a kernel compiled alone
      (layernorm/gelu outside a compiled block, cross_entropy always) +9 s; each Triton
      kernel's JIT +2.5 s; +-10% per (plan, repeat). Counted in wall_s, before the steps.
  W3  Noise: samples_per_s x (1 + u), u uniform in [-4%, +4%] per (plan, repeat), seeded
      from a hash of the configuration (its settings with defaults filled in) and repeat.
  W4  Out of memory: the trial dies in its first step (wall = start + compile + half a
      step); it reports the capacity as its peak.
  W5  Failed, always: torch.compile + tensor parallel + checkpointing (compiling a DTensor
      block inside a non-reentrant checkpoint wrapper: a class of failure torch 2.x
      has had; an invented rule, there to make the search meet one), after 70% of its
      compile. Failed by chance: 0.3% of (plan, repeat) on one GPU, 1% on eight (a rank
      lost: Xid, NCCL watchdog), at a uniform point of its steps; the same plan runs with
      another repeat. Failed: a plan past its timeout_s (at timeout_s), or one the surface
      cannot model (another workload).
Not modelled: data loading (synthetic tokens), thermals/clock drift, NVLS/SHARP, CPU
contention between ranks, Inductor's autotuning, compile graph breaks other than W5/T7.
Checked against the three GPT-2 small trials measured on an H100 (the doc in H3): fp32 at
micro-batch 32 ran at 42.1 samples/s, the surface gives 43.1; bf16 + SDPA + fused AdamW at
micro-batch 64 ran at 363, the surface gives 334.5 (-8%); but micro-batch 2, fp16,
checkpoint every 2, eager attention, compile (and a compiled bias+GELU) ran at 63.2 where
the surface gives 187: whatever slowed that trial (graph breaks around the checkpoint
wrapper? recompiles?) is not modelled. On eight GPUs the surface's best (ZeRO-2, bf16,
compile, micro-batch 8) is 237 samples/s, 56% MFU of the bf16 datasheet peak: likely
optimistic for a 1.3B model (it is what H5's GEMM efficiency at width 2048 gives); no
8-GPU trial has been measured to check it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.benchmarks.surfaces.assumptions import BASE, Assumptions
from tests.benchmarks.surfaces.config import Config, Unsupported, read, unit
from tests.benchmarks.surfaces.gpt_memory import memory
from tests.benchmarks.surfaces.gpt_time import step_time
from tests.benchmarks.surfaces.hardware import CAPACITY

NOISE = BASE.noise
TEARDOWN_S = 2.0


@dataclass(frozen=True)
class Node:
    gpus: int
    start_s: float
    first_step_s: float
    chance_failure: float


ONE_GPU = Node(gpus=1, start_s=9.0, first_step_s=1.5, chance_failure=0.003)
EIGHT_GPUS = Node(gpus=8, start_s=22.0, first_step_s=4.0, chance_failure=0.01)


def compile_s(c: Config) -> float:
    s = 0.0
    if c.compile:
        s += (62.0 if c.hidden <= 1024 else 75.0) + 10.0 * (c.checkpoint_every > 0)
        s += 15.0 * (c.tensor > 1) + 5.0 * (c.dp == "zero" and c.zero_stage >= 2)
        s += 5.0 * (c.pipeline > 1)
    alone = [k for k in (c.layernorm, c.gelu) if k == "compile" and not c.compile]
    s += 9.0 * (len(alone) + (c.cross_entropy == "compile"))
    s += 2.5 * sum(k == "triton" for k in (c.layernorm, c.gelu, c.cross_entropy, c.opt_impl))
    return s


def _refused(c: Config, node: Node) -> str | None:
    if c.world != node.gpus:
        return f"this surface is {node.gpus} GPU(s); the plan's layout needs {c.world}"
    if c.compile and c.tensor > 1 and c.checkpoint_every:
        return "torch.compile of a tensor-parallel block inside a checkpoint wrapper fails"
    return None


def _truth(plan: dict[str, Any], node: Node, a: Assumptions = BASE) -> dict[str, Any]:
    """Noise-free: the status every repeat but W5's chance failures would have."""
    try:
        c = read(plan)
    except Unsupported as e:
        return {"status": "failed", "reason": str(e), "samples_per_s": 0.0,
                "peak_memory_bytes": 0}
    mem = memory(c, a)
    base = {"samples_per_s": 0.0, "peak_memory_bytes": mem.held(mem.cache(c)), "config": c}
    if why := _refused(c, node):
        return base | {"status": "failed", "reason": why}
    step = step_time(c, a)
    if mem.oom:
        return base | {"status": "oom", "reason": "CUDA out of memory",
                       "peak_memory_bytes": CAPACITY, "step_time_s": step}
    return base | {"status": "ok", "samples_per_s": c.batch / step, "step_time_s": step}


def _trial(plan: dict[str, Any], repeat: int, node: Node, a: Assumptions = BASE
           ) -> dict[str, Any]:
    truth = _truth(plan, node, a)
    c: Config | None = truth.pop("config", None)
    if c is None:
        return truth | {"wall_s": 1.0}
    key = c.key()

    def spread(what: str, width: float) -> float:
        return 1.0 + width * (2 * unit(key, repeat, what) - 1)

    start = node.start_s * a.start * spread("start", 0.10) + 4.0 * (
        node.gpus > 1 and (c.dp == "zero" and c.zero_stage == 3 or c.tensor > 1
                           or c.pipeline > 1))
    comp = compile_s(c) * a.compile_time * spread("compile", 0.10)
    before = start + comp + node.first_step_s
    out = {k: v for k, v in truth.items() if k != "step_time_s"}
    out |= {"startup_s": start, "compile_s": comp}
    if truth["status"] == "failed":
        return out | {"wall_s": start + 0.7 * comp + TEARDOWN_S}
    step = truth["step_time_s"]
    if truth["status"] == "oom":
        return out | {"wall_s": before + 0.5 * step + TEARDOWN_S}
    rate = truth["samples_per_s"] * spread("rate", a.noise)
    step = c.batch / rate
    steps_s = (c.warmup + c.steps) * step
    mem = memory(c, a)
    cache = mem.cache(c) + 0.02 * (2 * unit(key, repeat, "cache") - 1)
    out |= {"samples_per_s": rate, "step_time_s": step, "peak_memory_bytes": mem.held(cache),
            "allocated_bytes": int(mem.allocated),
            "reserved_bytes": int(mem.allocated * (1 + cache)),
            "device_base_bytes": int(mem.beside)}
    if unit(key, repeat, "chance failure") < node.chance_failure:
        return out | {"status": "failed", "reason": "a rank died (chance failure)",
                      "samples_per_s": 0.0,
                      "wall_s": before + steps_s * unit(key, repeat, "when") + TEARDOWN_S}
    wall = before + steps_s + TEARDOWN_S
    if wall > c.timeout_s:
        return out | {"status": "failed", "reason": f"timed out after {c.timeout_s:g} s",
                      "samples_per_s": 0.0, "wall_s": c.timeout_s}
    return out | {"wall_s": wall}


Surface = Callable[[dict[str, Any], int], dict[str, Any]]


def make_surface(node: Node, a: Assumptions, name: str, doc: str) -> Surface:
    """A surface over `node` under the assumptions `a`: `function(plan, repeat)` with
    `function.truth(plan)`, its `name` and `doc` (a line: what it assumes differently)."""

    def surface(plan: dict[str, Any], repeat: int) -> dict[str, Any]:
        return _trial(plan, repeat, node, a)

    surface.truth = lambda plan: _truth(plan, node, a)  # type: ignore[attr-defined]
    surface.assumptions = a  # type: ignore[attr-defined]
    surface.node = node  # type: ignore[attr-defined]
    surface.__name__ = surface.__qualname__ = name
    surface.__doc__ = doc
    return surface


def gpt2_small_1gpu(plan: dict[str, Any], repeat: int) -> dict[str, Any]:
    """studies/gpt2-small-1gpu.toml's space on one H100 SXM 80GB."""
    return _trial(plan, repeat, ONE_GPU)


def gpt_1b_8gpu(plan: dict[str, Any], repeat: int) -> dict[str, Any]:
    """studies/gpt-1b-8gpu.toml's space on one node of 8 H100 SXM 80GB (NVLink)."""
    return _trial(plan, repeat, EIGHT_GPUS)


gpt2_small_1gpu.truth = lambda plan: _truth(plan, ONE_GPU)  # type: ignore[attr-defined]
gpt_1b_8gpu.truth = lambda plan: _truth(plan, EIGHT_GPUS)  # type: ignore[attr-defined]
