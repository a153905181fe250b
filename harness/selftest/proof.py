"""What `harness selftest --gpu` proves, in which order, and the time box of each phase.

The default run fits 9 minutes of wall clock on one H100 or H200 (a leased GPU machine
gives 15 minutes in all, its start and the wheels' install included):

    tests   the `gpu` tests that are not `slow`, and tests/kernels natively
    bench   the single-GPU plans that matter most (CORE_PLANS), in that order
    tune    a short GPT-2 small study that starts from its known-good configuration
            and searches float8 and CUDA graphs
    report  `harness report` of that study
    rest    with a longer --time-limit only: the slow `gpu` tests, then the proof's plans
            the bench's box left out, then every other plan under studies/plans/ that
            fits the GPUs here

Each phase ends by its box: a step still running then is stopped, and what did not fit
is listed on the page with the reason. A phase that ends early leaves its time to the
`rest`. The rehearsal (`--rehearse`) runs the same phases on the CPU with tiny sizes.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from training_harness.core.errors import HarnessError


def _repository() -> Path:
    """The repository the proof runs in (its tests/ and studies/): this package's checkout,
    else the working folder (a GPU machine runs the project's wheel from the repository's
    root: docs/gpu.md)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "tests").is_dir() and (here / "studies").is_dir() else Path.cwd()


ROOT = _repository()


@dataclass(frozen=True)
class Timing:
    """The default boxes of one kind of run, in seconds; the tune's is its budget plus
    its overhead."""

    tests: float
    bench: float
    report: float
    tune_budget: float
    time_limit: float
    tune_min: float  # a shorter study proves nothing
    start: float  # this process and the device probe, before the first phase
    tune_overhead: float  # the tuner's start and its last records, beyond its budget
    end: float  # kept at the end: a step's stop (runner.GRACE_S) and the last page
    core_min: float  # tests and bench together get at least this, or the limit is refused


GPU = Timing(tests=100.0, bench=180.0, report=30.0, tune_budget=150.0, time_limit=525.0,
             tune_min=60.0, start=15.0, tune_overhead=30.0, end=20.0, core_min=60.0)
# The rehearsal: the same phases on the CPU in 2.25 minutes (a quiet 2-core machine; its
# `gpu` selection alone takes 11 s there, pytest's start and torch's import)
REHEARSAL = Timing(tests=25.0, bench=45.0, report=13.0, tune_budget=25.0, time_limit=135.0,
                   tune_min=10.0, start=5.0, tune_overhead=12.0, end=10.0, core_min=30.0)

PHASES = ("tests", "bench", "tune", "report", "rest", "table")
# The phase that takes what is left: its box, and the time the phases before it did not
# use (training_harness.cli.selftest). Not the rest: a proof that ends early ends sooner.
FILLERS = ("table",)
DEFAULT_PHASES = PHASES[:5]  # the table (the search replay's GPU table) only when asked

# --- the tests ------------------------------------------------------------------------


@dataclass(frozen=True)
class Suite:
    name: str
    args: tuple[str, ...]  # pytest's selection on a GPU
    rehearse: tuple[str, ...]  # the same kind of selection, small, for the CPU
    files: str = ""  # "gpu": the test files that hold `gpu`-marked tests, found at run time


CORE_TESTS = (
    # the CUDA paths a CPU never runs; `slow` ones (a whole trial, ResNet's TF32 peak,
    # the tuner leaving the GPU alone) are proved again by the bench and tune phases
    Suite("gpu", ("-m", "gpu and not slow"), ("-m", "gpu and not slow"), files="gpu"),
    # the Triton kernels against their references, compiled for the device; rehearsed:
    # one file's dispatch checks in this process (its fresh-interpreter test is the
    # suite's: the rehearsal proves the phase runs and records, not the kernels)
    Suite("kernels", ("tests/kernels",), ("tests/kernels/test_kernel_dispatch.py", "-k",
                                          "not imported_too_early")),
)
REST_TESTS = (Suite("gpu-slow", ("-m", "gpu and slow"), ("-m", "gpu and slow"), files="gpu"),)


def gpu_test_files(root: Path) -> list[str]:
    """The test modules that mark tests `gpu`: pytest collects only these (collecting all
    of tests/ imports every module, seconds a GPU machine need not spend)."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        text = path.read_text(errors="replace")
        if "mark.gpu" in text or 'marks=pytest.mark.gpu' in text:
            found.append(str(path.relative_to(root)))
    return found


def suite_args(suite: Suite, root: Path, rehearse: bool) -> list[str]:
    # A selection runs in one process, not the addopts' xdist workers: on one GPU they
    # would share the device (a memory test reads NVML's, the whole device's), and on the
    # CPU they would import torch again in each (~6 CPU-s a selection) for a handful of tests.
    args = ["-n", "0", *(suite.rehearse if rehearse else suite.args)]
    if suite.files == "gpu":
        args += gpu_test_files(root) or ["tests"]
    return args


# --- the plans ------------------------------------------------------------------------

CORE_PLANS = (
    # first the known-good GPT-2 small, then, each changing one thing of it, what no GPU
    # has run yet: the fused linear cross-entropy, sliding-window attention at 4096 (against
    # full attention there) and at 1024, cuDNN's SDPA, FlexAttention; Liger on a small
    # Llama against the same Llama without it; then float8 and CUDA graphs, selective
    # checkpointing
    "studies/selftest/plans/gpt2-small-bf16.toml",
    "studies/selftest/plans/gpt2-small-linear-ce.toml",
    "studies/selftest/plans/gpt2-small-4096-bf16.toml",
    "studies/selftest/plans/gpt2-small-4096-sliding-window.toml",
    "studies/selftest/plans/gpt2-small-sliding-window.toml",
    "studies/selftest/plans/gpt2-small-sdpa-cudnn.toml",
    "studies/selftest/plans/gpt2-small-flex.toml",
    "studies/selftest/plans/llama-1b-bf16.toml",
    "studies/selftest/plans/llama-1b-liger.toml",
    "studies/selftest/plans/gpt2-small-float8-tensorwise.toml",
    "studies/selftest/plans/gpt2-small-float8-rowwise.toml",
    "studies/selftest/plans/gpt2-small-cuda-graphs.toml",
    "studies/selftest/plans/checkpoint-selective.toml",
    # then the plans the 2026-11-23 run measured, the measuring code having changed since
    "studies/plans/quickstart.toml",
    "studies/plans/amp-bf16.toml",
    "studies/plans/fused.toml",
    "studies/plans/checkpoint.toml",
    "studies/plans/gpt-medium.toml",
)
REST_PLANS = "studies/plans/*.toml"
GPU_STUDY = "studies/selftest/gpt2-small-tune.toml"
REHEARSAL_STUDY = "studies/selftest/rehearse-tune.toml"

# The rehearsal's tiny sizes, given to `harness bench` as flags over each plan
TINY_FLAGS = ("--device", "cpu", "--micro-batch-size", "2", "--global-batch-size", "2",
              "--steps", "2", "--warmup-steps", "1")
TINY_GPT = ("--arg", "layers=1", "--arg", "heads=2", "--arg", "hidden=64",
            "--arg", "seq_len=64", "--arg", "vocab=512")
TINY_HF = ("--arg", "num_hidden_layers=1", "--arg", "hidden_size=64", "--arg",
           "intermediate_size=128", "--arg", "num_attention_heads=2", "--arg",
           "num_key_value_heads=1", "--arg", "head_dim=32", "--arg", "vocab_size=512",
           "--arg", "seq_len=64")
# What a CPU cannot run, and what stands in for it there: float8 emulated (same casts,
# high-precision matmuls); no compile (a CPU compiles for longer than the rehearsal)
CPU_STAND_INS = {"float8": {"emulate": True},
                 "fused": {"compile": False, "compile_mode": "default", "sdpa_backend": "auto",
                           "attention": "sdpa"}}
# What a CPU cannot run and nothing stands in for: such a plan is not rehearsed, and the
# rehearsal's page says why (Liger's kernels are Triton for GPUs)
CUDA_ONLY = {"liger": "Liger's kernels are Triton for CUDA GPUs"}


def cuda_only(plan: Path) -> str | None:
    """Why `plan` cannot be rehearsed on a CPU, or None."""
    strategies = tomllib.loads(plan.read_text()).get("strategies") or {}
    return next((f"{name}: {why}" for name, why in CUDA_ONLY.items() if name in strategies),
                None)


def _flag_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def rehearsal_flags(plan: Path) -> list[str]:
    """The flags that make `plan` a tiny CPU bench: TINY_FLAGS, and its strategies that a
    CPU cannot run given with their stand-ins (a --strategy flag replaces the plan's
    settings of that strategy, so they are all repeated)."""
    data = tomllib.loads(plan.read_text())
    workload = data.get("workload")
    name = workload.get("name") if isinstance(workload, dict) else workload
    tiny = TINY_GPT if name == "gpt" else TINY_HF if str(name).startswith("hf:") else ()
    flags = list(TINY_FLAGS) + list(tiny)
    for name, settings in (data.get("strategies") or {}).items():
        if name in CPU_STAND_INS:
            merged = {**(settings or {}), **CPU_STAND_INS[name]}
            text = ",".join(f"{k}={_flag_value(v)}" for k, v in merged.items())
            flags += ["--strategy", f"{name}:{text}"]
    return flags


# --- the time boxes -------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    phase: str
    seconds: float
    what: str


def boxes(phases: list[str], limit_s: float, budget_s: float, timing: Timing,
          rehearse: bool = False) -> list[Box]:
    """The box of each phase asked, in order. tests and bench get their defaults, or a
    share of what the tune and the report leave within `limit_s` (refused below a
    `timing.core_min` together); the tune its budget plus its overhead; `rest` what is left."""
    what = {
        "tests": ("the `gpu` tests that are not slow, and tests/kernels" if not rehearse
                  else "pytest: the `gpu` selection (skipped on the CPU) and one kernel file"),
        "bench": f"the device's profile, then harness bench of {len(CORE_PLANS)} plans"
                 + (" (tiny, on the CPU)" if rehearse else ""),
        "tune": f"harness tune {REHEARSAL_STUDY if rehearse else GPU_STUDY}, "
                f"budget {budget_s:.0f} s",
        "report": "harness report of the tune",
        "rest": "the slow `gpu` tests, then the other plans of " + REST_PLANS,
        "table": "harness tune of the GPU table study, resumed; also what the phases "
                 "before it leave",
    }
    fixed = {"tune": budget_s + timing.tune_overhead, "report": timing.report}
    wanted = {"tests": timing.tests, "bench": timing.bench}
    left = limit_s - timing.start - timing.end - sum(fixed[p] for p in phases if p in fixed)
    asked = {p: s for p, s in wanted.items() if p in phases}
    if "tune" in phases and budget_s < timing.tune_min:
        raise HarnessError(f"--tune-budget {budget_s:.0f}s: a study this short proves "
                           f"nothing; give it {timing.tune_min:.0f}s at least")
    least = timing.core_min if asked else 0.0
    if left < least:
        need = limit_s - left + least
        raise HarnessError(f"--time-limit {limit_s:.0f}s leaves {max(left, 0):.0f} s for "
                           f"{' and '.join(asked) or 'the phases'} after the tune and the "
                           f"report: raise it to {math.ceil(need)}s or more, or lower "
                           "--tune-budget")
    # a shorter limit shrinks tests and bench; a longer one gives the surplus to the rest
    # (or the table), or, where neither runs, to tests and bench
    fill = not {"rest", "table"} & set(phases)
    scale = left / sum(asked.values()) if asked else 1.0
    sizes = {**{p: s * min(1.0, scale) for p, s in asked.items()}, **fixed}
    if fill and scale > 1.0:  # the surplus to tests, bench and the report alike
        grow = asked | ({"report": timing.report} if "report" in phases else {})
        scale = (left + grow.get("report", 0.0)) / sum(grow.values())
        sizes |= {p: s * scale for p, s in grow.items()}
    # what is left goes to the rest, or else to the table
    spare = max(0.0, left - sum(sizes[p] for p in asked))
    sizes["rest"] = spare
    sizes["table"] = 0.0 if "rest" in phases else spare
    return [Box(p, round(sizes[p], 1), what[p]) for p in PHASES if p in phases]


def plan_text(found: list[Box], limit_s: float, timing: Timing) -> str:
    """The lines `harness selftest --gpu --plan` prints."""
    rehearse = timing is REHEARSAL
    kind = "rehearsal on the CPU" if rehearse else "GPU proof"
    lines = [f"harness selftest --gpu{' --rehearse' if rehearse else ''}: the {kind}, "
             f"phases in order, each stopped at its box"]
    lines.append(f"  {'start':<7} {timing.start:5.0f} s  this process and the device probe")
    for box in found:
        if box.phase in ("rest", "table") and box.seconds <= 0:
            lines.append(f"  {'rest':<7}     0 s  not in this run: a longer --time-limit "
                         "adds the slow gpu tests and the other plans")
        else:
            lines.append(f"  {box.phase:<7} {box.seconds:5.0f} s  {box.what}")
    lines.append(f"  {'end':<7} {timing.end:5.0f} s  kept for stopping a step and the last page")
    total = timing.start + sum(box.seconds for box in found) + timing.end  # rest: 0 or more
    lines.append(f"  {'total':<7} {total:5.0f} s  ({total / 60:.1f} min; time limit "
                 f"{limit_s / 60:.1f} min)")
    return "\n".join(lines)


def phase_end(phase: str, now: float, box_s: float, deadline: float, later_s: float,
              end_s: float) -> float:
    """When a phase starting `now` must stop: at its box, leaving the later phases'
    boxes (`later_s`) before the deadline; a FILLER also takes what the phases before
    it left unused, up to the deadline less the later boxes and the end's reserve."""
    end = min(now + box_s, deadline - later_s)
    return max(end, deadline - later_s - end_s) if phase in FILLERS else end
