"""What torch.compile costs a trial: the warm-up's time beyond its settled steps.

Compilation is lazy: the first forward compiles each block's graph, the first
backward its backward graph, and reduce-overhead records its CUDA graphs on the
steps after. Whatever the mode, that time lands in the warm-up's first steps, so
the trial's compile time is the warm-up steps' excess over the settled step time
(their median): `metrics.compile_s`. Kept for compiled plans only (None otherwise,
where the same excess is the allocator's and kernels' first-use cost, not compile).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def compiles(strategies: dict[str, Any]) -> bool:
    """Whether the plan's strategies torch.compile anything (fused compile, or a kernel
    swapped for its compiled version)."""
    fused = strategies.get("fused")
    if fused is None:
        return False
    from training_harness.strategies.fused import FusedSettings
    from training_harness.strategies.kernel_swaps import SWAPS
    from training_harness.strategies.registry import get

    settings: FusedSettings = get("fused").parse(fused)
    return settings.compile or any(getattr(settings, k) == "compile" for k in SWAPS)


def compile_seconds(warm_times: list[float], steady_s: float | None) -> float | None:
    """The warm-up steps' seconds beyond `steady_s` each, summed (None without both)."""
    if not warm_times or steady_s is None:
        return None
    return round(sum(max(0.0, t - steady_s) for t in warm_times), 4)


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_env(trial_dir: Path, study: str | None, env: dict[str, str]
                       ) -> dict[str, str]:
    """The study's own inductor cache for a trial of a study (runs/<study>/trials/<id>):
    runs/<study>/inductor_cache, shared by its trials, so a repeat compiles warm and no
    other study's kernels are reused. Nothing for a lone bench, or where the user set
    TORCHINDUCTOR_CACHE_DIR."""
    trial_dir = Path(trial_dir)
    if study is None or INDUCTOR_CACHE_ENV in env or trial_dir.parent.name != "trials":
        return {}
    return {INDUCTOR_CACHE_ENV: str(trial_dir.parent.parent / "inductor_cache")}
