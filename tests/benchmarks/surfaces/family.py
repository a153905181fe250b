"""A family of simulated surfaces over the two GPU study spaces, to judge a search on many
pictures of the hardware instead of the one the estimator shares with h100.py.

    from tests.benchmarks.surfaces.family import members, surface
    for s in members("gpt-1b-8gpu"):          # base, named, drawn: 17 surfaces
        s(plan, repeat); s.truth(plan); s.__name__; s.__doc__   # as h100.py's two
    surface("gpt2-small-1gpu", "compile-weak")

Every member is h100.py's model (its docstring states the model and its base figures)
under an assumptions.Assumptions that differs from the base in stated ways. Three kinds:

base (one per space)
  The base picture (assumptions.BASE): the same answers as h100.gpt_1b_8gpu and
  h100.gpt2_small_1gpu.

named: the estimator wrong on exactly one factor (2-2.5x but comm-pcie), the rest the base's
  comm-slow         collectives 2.5x slower: bus bandwidth 144 GB/s (360 / 2.5) and 50 us a
                    collective; point-to-point 160 GB/s and 75 us (an oversubscribed or
                    PCIe-switched node, NCCL on fewer channels). 8-GPU space only.
  comm-fast         collectives 2.5x faster: bus bandwidth 900 GB/s, 8 us a collective;
                    point-to-point 1 TB/s, 12 us (NVLS/SHARP-like reductions). 8-GPU only.
  comm-pcie         beyond 2.5x: a PCIe-like node without NVLink: bus bandwidth 25 GB/s
                    (14x slower), 40 us a collective, point-to-point 32 GB/s and 40 us, where
                    communication, not compute, decides the layout. 8-GPU space only.
  recompute-heavy   a checkpointed block's recompute costs 2.5x its forward (the wrapper
                    recomputes attention without the flash kernel, re-gathers, syncs).
  recompute-cheap   the recompute costs 0.4x its forward (selective: only cheap ops redone).
  launch-slow       every eager CPU cost 2.5x (op dispatch, autograd nodes, DTensor, FSDP
                    hooks: a slow host CPU, a debug build, Python overhead).
  launch-fast       every eager CPU cost 0.4x (a fast host; C++ dispatch paths).
  compile-weak      compile buys 2.5x less: no element-wise or score traffic saved (the
                    base saves 60% and 55%), and a compiled block's CPU cost 2.5x (guards,
                    recompiles).
  compile-strong    compile buys 2.5x more: element-wise traffic 16% of eager (the base's
                    40% / 2.5), scores 18%, a compiled block's CPU cost 0.4x (CUDA-graph-like).
  memory-high       activations take 2x the bytes (kept for backward and passing through it:
                    dropout masks, unfused intermediates the model does not count).
  memory-low        activations take 0.5x the bytes (fused and in-place kernels).

drawn: `DRAWN[space]` surfaces per space, every field drawn independently per surface from
  random.Random(f"family:{space}:{i}") (i = 0, 1, ...), from these ranges (U uniform, L
  log-uniform, figures per the fields of assumptions.Assumptions):
  node          NVLink-like with p 0.7: bus bandwidth L(200, 450) GB/s, p2p L(250, 450)
                GB/s; else PCIe-like: bus bandwidth L(15, 50) GB/s, p2p L(20, 55) GB/s
  half_bw_bytes L(0.5, 8) MB; collective and p2p latency each L(10, 60) us
  dp_overlap, prefetch_overlap  U(0.5, 0.95) each
  GEMMs         16-bit top U(0.6, 0.85), width L(100, 400), tokens L(256, 4096);
                fp32 top U(0.65, 0.85), width L(32, 128), tokens L(128, 1024)
  attention     flash U(0.3, 0.6), memory-efficient U(0.4, 0.7), explicit U(0.5, 0.9)
  bandwidth     hbm_eff U(0.6, 0.9), optimizer_eff U(0.5, 0.9)
  recompute L(0.5, 2); eager_launch L(0.5, 2); compiled_launch L(0.5, 2)
  compile       compile_elementwise U(0.2, 0.9), compile_scores U(0.2, 0.9), compile_time
                L(0.6, 1.6)
  memory        context L(0.5, 2) GiB, compiled_extra U(0.1, 0.6) GiB, nccl_buffers
                U(0.25, 1.5) GiB, activations L(0.7, 1.5), cache_base U(0.03, 0.15),
                oom_slack U(0.01, 0.08)
  trials        start L(0.7, 1.5), noise U(0.02, 0.06)
  A drawn surface's line names its three largest departures from the base (by the log of
  the ratio) and its node kind.

What every member keeps from h100.py: the device (an H100 SXM's peaks, HBM bandwidth,
79.18 GiB), the workloads' shapes and FLOPs, the failure rules (W5), the compile seconds'
structure (scaled by compile_time). The replay's estimator (surface_replay.world) sees the
base's device overhead on every member: its measured context is not the member's.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

from tests.benchmarks.surfaces.assumptions import BASE, GIB, Assumptions
from tests.benchmarks.surfaces.h100 import EIGHT_GPUS, ONE_GPU, Node, Surface, make_surface

SPACES: dict[str, Node] = {"gpt-1b-8gpu": EIGHT_GPUS, "gpt2-small-1gpu": ONE_GPU}
DRAWN = {"gpt-1b-8gpu": 5, "gpt2-small-1gpu": 5}
K = 2.5  # the named surfaces' error on their one factor

# name -> (what changes, the line that says so, spaces where it applies: None for both)
NAMED: dict[str, tuple[dict[str, float], str, tuple[str, ...] | None]] = {
    "comm-slow": ({"busbw": BASE.busbw / K, "collective_latency": BASE.collective_latency * K,
                   "p2p_bw": BASE.p2p_bw / K, "p2p_latency": BASE.p2p_latency * K},
                  "collectives and point-to-point 2.5x slower (bus 144 GB/s, 50 us)",
                  ("gpt-1b-8gpu",)),
    "comm-fast": ({"busbw": BASE.busbw * K, "collective_latency": BASE.collective_latency / K,
                   "p2p_bw": BASE.p2p_bw * K, "p2p_latency": BASE.p2p_latency / K},
                  "collectives and point-to-point 2.5x faster (bus 900 GB/s, 8 us)",
                  ("gpt-1b-8gpu",)),
    "comm-pcie": ({"busbw": 25e9, "collective_latency": 40e-6, "p2p_bw": 32e9,
                   "p2p_latency": 40e-6},
                  "a PCIe-like node: bus 25 GB/s (14x slower), p2p 32 GB/s, 40 us",
                  ("gpt-1b-8gpu",)),
    "recompute-heavy": ({"recompute": K}, "a checkpointed block's recompute costs 2.5x its "
                        "forward", None),
    "recompute-cheap": ({"recompute": 1 / K}, "a checkpointed block's recompute costs 0.4x "
                        "its forward", None),
    "launch-slow": ({"eager_launch": K}, "every eager CPU cost (ops, autograd, DTensor, FSDP "
                    "hooks) 2.5x", None),
    "launch-fast": ({"eager_launch": 1 / K}, "every eager CPU cost 0.4x", None),
    "compile-weak": ({"compile_elementwise": 1.0, "compile_scores": 1.0,
                      "compiled_launch": K},
                     "compile saves no element-wise traffic, its CPU cost 2.5x", None),
    "compile-strong": ({"compile_elementwise": BASE.compile_elementwise / K,
                        "compile_scores": BASE.compile_scores / K, "compiled_launch": 1 / K},
                       "compile cuts element-wise traffic to 16% (base 40%), its CPU cost "
                       "0.4x", None),
    "memory-high": ({"activations": 2.0}, "activations take 2x the bytes", None),
    "memory-low": ({"activations": 0.5}, "activations take 0.5x the bytes", None),
}


def _u(lo: float, hi: float) -> Callable[[random.Random], float]:
    return lambda rng: rng.uniform(lo, hi)


def _l(lo: float, hi: float) -> Callable[[random.Random], float]:
    return lambda rng: math.exp(rng.uniform(math.log(lo), math.log(hi)))


# The distribution of the drawn surfaces (the module docstring states it), field by field,
# in this order (a field added later goes last, so that earlier draws keep their values).
NVLINK = {"busbw": _l(200e9, 450e9), "p2p_bw": _l(250e9, 450e9)}
PCIE = {"busbw": _l(15e9, 50e9), "p2p_bw": _l(20e9, 55e9)}
RANGES: dict[str, Callable[[random.Random], float]] = {
    "half_bw_bytes": _l(0.5e6, 8e6), "collective_latency": _l(10e-6, 60e-6),
    "p2p_latency": _l(10e-6, 60e-6), "dp_overlap": _u(0.5, 0.95),
    "prefetch_overlap": _u(0.5, 0.95),
    "gemm_top16": _u(0.6, 0.85), "gemm_width16": _l(100, 400), "gemm_tokens16": _l(256, 4096),
    "gemm_top32": _u(0.65, 0.85), "gemm_width32": _l(32, 128), "gemm_tokens32": _l(128, 1024),
    "flash_eff": _u(0.3, 0.6), "mem_eff_attention": _u(0.4, 0.7),
    "explicit_attention": _u(0.5, 0.9), "hbm_eff": _u(0.6, 0.9), "optimizer_eff": _u(0.5, 0.9),
    "recompute": _l(0.5, 2.0), "eager_launch": _l(0.5, 2.0), "compiled_launch": _l(0.5, 2.0),
    "compile_elementwise": _u(0.2, 0.9), "compile_scores": _u(0.2, 0.9),
    "compile_time": _l(0.6, 1.6),
    "context": _l(0.5 * GIB, 2 * GIB), "compiled_extra": _u(0.1 * GIB, 0.6 * GIB),
    "nccl_buffers": _u(0.25 * GIB, 1.5 * GIB), "activations": _l(0.7, 1.5),
    "cache_base": _u(0.03, 0.15), "oom_slack": _u(0.01, 0.08),
    "start": _l(0.7, 1.5), "noise": _u(0.02, 0.06),
}


def draw(space: str, i: int) -> tuple[Assumptions, str]:
    """The i-th drawn surface's assumptions for `space`, and its line."""
    rng = random.Random(f"family:{space}:{i}")
    nvlink = rng.random() < 0.7
    fields = {k: f(rng) for k, f in (NVLINK if nvlink else PCIE).items()}
    fields |= {k: f(rng) for k, f in RANGES.items()}
    a = dataclasses.replace(BASE, **fields)
    node = ("NVLink-like" if nvlink else "PCIe-like") + f" (bus {a.busbw / 1e9:.0f} GB/s)"
    gpus = SPACES[space].gpus
    # the departures that can matter here: communication only with several GPUs
    varied = [k for k in RANGES if gpus > 1 or k not in COMM_FIELDS]
    top = sorted(varied, key=lambda k: -abs(math.log(getattr(a, k) / getattr(BASE, k))))[:3]
    said = ", ".join(f"{k} x{getattr(a, k) / getattr(BASE, k):.2f}" for k in top)
    return a, f"drawn #{i}: " + (f"{node}, " if gpus > 1 else "") + f"{said} (every field drawn)"


COMM_FIELDS = {"busbw", "p2p_bw", "half_bw_bytes", "collective_latency", "p2p_latency",
               "dp_overlap", "prefetch_overlap", "nccl_buffers"}


def members(space: str, drawn: int | None = None) -> list[Surface]:
    """The family over `space`: the base, the named surfaces that apply, `drawn` drawn ones
    (DRAWN[space] by default). Names are "base", "comm-slow", ..., "drawn-0", ..."""
    if space not in SPACES:
        raise KeyError(f"no family for {space!r}: one of {', '.join(SPACES)}")
    node = SPACES[space]
    out = [make_surface(node, BASE, "base", "the base picture: h100.py's figures, as the "
                                            "estimator assumes them")]
    for name, (changes, line, spaces) in NAMED.items():
        if spaces is None or space in spaces:
            out.append(make_surface(node, dataclasses.replace(BASE, **changes), name, line))
    for i in range(DRAWN[space] if drawn is None else drawn):
        a, line = draw(space, i)
        out.append(make_surface(node, a, f"drawn-{i}", line))
    for s in out:
        s.space = space  # type: ignore[attr-defined]
    return out


def surface(space: str, name: str) -> Surface:
    """One member by name (a drawn one by "drawn-<i>", any i)."""
    if name.startswith("drawn-"):
        a, line = draw(space, int(name.removeprefix("drawn-")))
        s = make_surface(SPACES[space], a, name, line)
        s.space = space  # type: ignore[attr-defined]
        return s
    found = {s.__name__: s for s in members(space, drawn=0)}
    if name not in found:
        raise KeyError(f"no surface {name!r} over {space}: one of {', '.join(found)}, drawn-<i>")
    return found[name]


def describe(space: str) -> list[dict[str, Any]]:
    """Each member's name and line (for the report)."""
    return [{"surface": s.__name__, "assumes": s.__doc__} for s in members(space)]
