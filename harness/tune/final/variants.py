"""After a search that converged: the best with the precisions and compile modes the
study's space left out, each measured once.

A study keeps its space small enough to search in hours, so a precision (fp32+TF32,
the other 16-bit type, bf16 with float8 linears) or a compile mode it does not list
is never tried. Once the search has converged, or measured its whole space, a long
budget has time to spare, and the best configuration is measured again with each of
those changed, one at a time.

A variant is not a candidate for the best: the named best stays a configuration of
the study's space, which best.toml, the confirmation rounds and the ablation speak
of. The summary lists each variant's throughput against the best and names the
setting to add to the study where one ran faster. A variant this machine cannot
run (float8 below compute capability 8.9, a compile mode off CUDA) is asked of the
torch-side helper first and left out with its reason, without a record.

Each record is tagged {"phase": "variant", "variant": {"of": <best trial id>,
"change": "<what differs>"}}; no Optuna trial stands behind it, so the sampler's
history stays the search's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.records.predicates import finished, may_be_best, ranked
from training_harness.records.tags import VARIANT, tags_of
from training_harness.tune.final.extra_trial import ExtraTrials, attempt_id
from training_harness.tune.model.estimator_model import resolved_key
from training_harness.tune.recorder import Measured
from training_harness.tune.study_trials import StudyTrials
from training_harness.tune.trial_job import TrialRunner

PRECISION_STRATEGIES = ("amp", "tf32", "float8")
# (what the variant says, the precision strategies it has), fp32 strict being the baseline
PRECISIONS = (
    ("fp32+TF32", {"tf32": {}}),
    ("bf16", {"amp": {"dtype": "bf16"}}),
    ("fp16", {"amp": {"dtype": "fp16"}}),
    ("bf16 + float8 linears", {"amp": {"dtype": "bf16"}, "float8": {}}),
)
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
VARIANTS_KEY = "variants"  # the Optuna study's user attribute, and study.json's key


@dataclass
class Variant:
    change: str
    strategies: dict[str, dict[str, Any]]


@dataclass
class VariantsRun:
    of: str | None = None
    ran: list[str] = field(default_factory=list)  # trial ids
    refused: dict[str, str] = field(default_factory=dict)  # change -> why not here
    ended: str = "done"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def variants(plan: dict[str, Any]) -> list[Variant]:
    """The best plan's variants: each other precision, and each other compile mode
    (compile turned on where the best does not compile)."""
    strategies = plan.get("strategies") or {}
    rest = {k: v for k, v in strategies.items() if k not in PRECISION_STRATEGIES}
    mine = {k: v for k, v in strategies.items() if k in PRECISION_STRATEGIES}
    out = [Variant(f"precision {label}", {**rest, **precision})
           for label, precision in PRECISIONS if not _same_precision(mine, precision)]
    fused = strategies.get("fused")
    if fused is not None:
        current = fused.get("compile_mode", "default") if fused.get("compile") else None
        out += [Variant(f"compile mode {mode}", {
            **strategies, "fused": {**fused, "compile": True, "compile_mode": mode}})
            for mode in COMPILE_MODES if mode != current]
    return out


def _same_precision(mine: dict[str, Any], other: dict[str, Any]) -> bool:
    if set(mine) != set(other):
        return False
    amp = (mine.get("amp") or {}).get("dtype", "bf16") if "amp" in mine else None
    want = (other.get("amp") or {}).get("dtype", "bf16") if "amp" in other else None
    return amp == want


def run_variants(trials: StudyTrials, run: TrialRunner, measured: Measured,
                 extra: ExtraTrials, fits: Callable[[], bool]) -> VariantsRun:
    """Measure the best's variants once each while `fits()` says one more fits beside
    what the confirmation and the ablation need."""
    out = VariantsRun()
    records = run.store.records()
    best = ranked_best(trials.best_trial(), records, run.budget_bytes)
    if best is None:
        out.ended = "no feasible trial to vary"
        return out
    out.of = str(best["trial_id"])
    recorded = {str(r["trial_id"]): r for r in records}
    base = Plan.from_dict(best["plan"])
    for i, v in enumerate(variants(best["plan"])):
        plan = base.replace(strategies=v.strategies, name=base.name)
        if resolved_key(run.facts, plan) in measured.by_key:
            continue  # the search measured it already
        try:
            run.torch_helper.prepare(plan, run.facts.peaks)
        except HarnessError as e:
            out.refused[v.change] = str(e)
            continue
        trial_id = attempt_id(recorded, f"variant-{out.of}-{i}")
        if trial_id is None:
            out.ran.append(f"variant-{out.of}-{i}")
            continue  # measured before a --resume
        if not fits():
            out.ended = "time: the rest is kept for the confirmation and the ablation"
            break
        tags = {"phase": VARIANT, "variant": {"of": out.of, "change": v.change}}
        result = extra.run_unlisted(trial_id, plan, tags)
        out.ran.append(trial_id)
        if not finished(result.to_dict()):
            out.ended = f"time: {result.reason}"
            break
    return out


def ranked_best(best: FrozenTrial | None, records: list[dict[str, Any]],
                budget_bytes: float) -> dict[str, Any] | None:
    """The best's record: the one the confirmation named, else the fastest candidate."""
    named = str(best.user_attrs.get("trial_id", best.number)) if best is not None else None
    rows = [r for r in ranked(records) if may_be_best(r, budget_bytes)]
    return next((r for r in rows if str(r["trial_id"]) == named), rows[0] if rows else None)


def variant_rows(records: list[dict[str, Any]], of: str) -> list[dict[str, Any]]:
    """Each measured variant of trial `of`: its change, status and samples/s."""
    rows = []
    for r in records:
        tag = tags_of(r).get("variant") or {}
        if str(tag.get("of")) == str(of) and tags_of(r).get("phase") == VARIANT:
            rows.append({"trial_id": r["trial_id"], "change": tag.get("change"),
                         "status": r["status"], "reason": r.get("reason"),
                         "samples_per_s": (r.get("metrics") or {}).get("samples_per_s")})
    return rows
