"""`harness plan`'s printout: the ranked predictions as a table that says what they are."""

from __future__ import annotations

from typing import Any

from training_harness.core.units import format_bytes, format_seconds


def render(study: Any, target: Any, ranked: list[Any], budget: int, space_size: int | None,
           top: int, seconds: float, predictions: str) -> str:
    from training_harness.records.plan_text import describe_plan, varying

    fit = [r for r in ranked if r.rate > 0]
    over = [r for r in ranked if r.rate <= 0 and r.predicted]
    refused = [r for r in ranked if not r.predicted]
    of = (f"all {len(ranked):,}" if space_size is not None and len(ranked) >= space_size
          else f"a seeded sample of {len(ranked):,} of "
               + (f"{space_size:,}" if space_size is not None else "its (ranges: unbounded)"))
    lines = [
        f"plan {study.name}: {study.workload} on {target.describe()}",
        f"PREDICTED, NOT MEASURED: {predictions}.",
        f"ranked {of} configurations in {format_seconds(seconds)}: {len(fit):,} predicted to "
        f"fit the memory budget of {format_bytes(budget)} per GPU, {len(over):,} over it, "
        f"{len(refused):,} refused on this target",
        "",
    ]
    shown = fit[:top] if fit else sorted(over, key=lambda r: r.peak)[:top]
    if not fit:
        lines.append("none is predicted to fit; the smallest predicted peaks:")
    lines.append(f"  {'#':>3}  {'samples/s':>10}  {'tokens/s':>10}  {'step':>9}  "
                 f"{'peak mem':>10}  {'fits':>4}  configuration")
    differ = varying([r.plan.to_dict() for r in shown])  # what tells the rows apart
    for i, r in enumerate(shown, 1):
        step = r.plan.batch_size / r.rate if r.rate else _raw_step(r)
        per = ((r.predicted or {}).get("target") or {}).get("tokens_per_sample")
        tokens = f"{r.rate * per:,.0f}" if per and r.rate else "-"
        rate = f"{r.rate:,.1f}" if r.rate else "-"
        lines.append(f"  {i:>3}  {rate:>10}  {tokens:>10}  {format_seconds(step):>9}  "
                     f"{format_bytes(r.peak):>10}  {'yes' if r.rate else 'no':>4}  "
                     f"{describe_plan(r.plan.to_dict(), differ)}")
    if refused:
        reasons: dict[str, int] = {}
        for r in refused:
            reasons[r.why_not] = reasons.get(r.why_not, 0) + 1
        lines.append("refused on this target: " + "; ".join(
            f"{n} x {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:3]))
    lines.append("peak mem: what the device would hold (tensors + CUDA context and workspaces "
                 "measured on an H100); step and samples/s: the estimator's model at MFU "
                 "0.5 of the datasheet peak plus launches and communication, uncorrected")
    return "\n".join(lines)


def _raw_step(r: Any) -> float | None:
    return (r.predicted or {}).get("step_time_s")
