"""`harness plan STUDY --target NAME`: the configurations the cost model ranks first on
GPUs you do not have, and `harness estimate PLAN --target NAME`: one plan's prediction.

Nothing runs and no GPU is needed: the target's datasheet (training_harness.core.gpus) stands in
for the device (training_harness.estimator.target). The ranking is the search's own: the
estimator's predicted samples/s, zero over the memory budget, as
training_harness.tune.model.estimator_model.Predictions rates a configuration before any trial is
measured (no correction), over the pool the search's first guesses draw
(training_harness.tune.model.estimator_model.first_guess_pool). One workload object serves every
configuration, so the estimator reads the model and traces each micro-batch size once
(training_harness.estimator.memo).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.units import format_bytes, format_seconds

PREDICTIONS = ("predictions from the estimator and the target's datasheet; nothing was run. "
               "Check the best with `harness bench` on the real GPU")


def add_target_flags(p: argparse.ArgumentParser, gpus_help: str) -> None:
    p.add_argument("--target", metavar="GPU",
                   help="predict for this GPU without having it, e.g. h100-sxm-80gb "
                        "(`harness plan --list-targets` lists them)")
    p.add_argument("--gpus", type=int, metavar="N", help=gpus_help)


class TargetPredictor:
    """Plans predicted on a target, one workload object per workload and arguments. It
    answers `prepare(plan, peaks)` as the tuner's torch-side helper does, so the search's
    own Predictions can rate configurations with it."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self._workloads: dict[str, Any] = {}
        self._convolutions: dict[int, bool] = {}  # by id of a workload of _workloads

    def workload(self, plan: Plan) -> Any:
        from training_harness.workloads import load_workload

        key = json.dumps([plan.workload, plan.workload_args], sort_keys=True, default=str)
        if key not in self._workloads:
            self._workloads[key] = load_workload(plan.workload, plan.workload_args)
        return self._workloads[key]

    def convolutions(self, workload: Any) -> bool:
        """Whether the model has convolutions (built once on the meta device)."""
        from training_harness.measure.prepare import has_convolutions

        if id(workload) not in self._convolutions:
            self._convolutions[id(workload)] = has_convolutions(workload)
        return self._convolutions[id(workload)]

    def prepare(self, plan: Plan, peaks: Any = None) -> SimpleNamespace:
        """The plan checked against the target and its prediction (`.predicted`, the
        record `harness estimate` prints); a HarnessError where the target refuses it."""
        from training_harness.estimator import estimate
        from training_harness.measure.peaks import autocast_dtype_name
        from training_harness.measure.prepare import flops_per_sample
        from training_harness.strategies.compose import resolved, validate

        target = self.target
        plan = plan.replace(device="cuda")
        if plan.world_size > target.gpus:
            raise HarnessError(f"the plan needs {plan.world_size} GPUs; --gpus {target.gpus}")
        runtime = target.runtime()
        workload = self.workload(plan)
        validate(plan, runtime)
        plan = resolved(plan)
        dtype = autocast_dtype_name(plan.strategies)
        if dtype == "fp32" and self.convolutions(workload):
            dtype = "tf32"  # cuDNN runs fp32 convolutions on TF32 tensor cores by default
        flops = flops_per_sample(plan, workload)
        est = estimate(plan, workload, runtime, target.peak_flops(dtype), flops,
                       target.overhead(), profile=target.profile())
        predicted = est.to_record()
        if target.profile() is None:
            predicted["assumptions"].append(
                f"No device profile measured on {target.gpu.label} is kept: the step is "
                "the datasheet's peak at an assumed MFU (`harness calibrate --device cuda "
                f"--out harness/estimator/profiles/{target.name}.json` on one keeps it)")
        if plan.world_size > runtime.device_count:  # the estimator models one node's link
            predicted["assumptions"].append(
                f"{plan.world_size} GPUs span {target.nodes} nodes of "
                f"{target.gpu.gpus_per_node}: the collectives are modelled at the node's "
                f"{target.gpu.link_kind} rate, not the network's (about "
                f"{(target.gpu.network or 0) / 1e9:.0f} GB/s per GPU): optimistic")
        predicted["target"] = {"name": target.name, "gpus": target.gpus, "dtype": dtype,
                               "tokens_per_sample": workload.tokens_per_sample}
        return SimpleNamespace(plan=plan, predicted=predicted, workload=workload)


# --- harness estimate PLAN --target ------------------------------------------------------


def estimate_on_target(args: argparse.Namespace, plan: Plan) -> int:
    from training_harness.cli.bench_table import estimate_table
    from training_harness.estimator.target import Target

    target = Target.named(args.target, args.gpus or plan.world_size)
    if args.gpus and args.gpus != plan.world_size:  # the same layout, its data axis widened
        lay = plan.layout
        if args.gpus % (lay.pipeline * lay.tensor):
            raise HarnessError(f"--gpus {args.gpus}: not a multiple of the plan's pipeline x "
                               f"tensor ({lay.pipeline} x {lay.tensor})")
        data = args.gpus // (lay.pipeline * lay.tensor)
        plan = plan.replace(layout=dataclasses.replace(lay, data=data))
    prep = TargetPredictor(target).prepare(plan)
    if args.json:
        print(json.dumps(prep.predicted, indent=2))
        return 0
    print(f"estimate {plan.name}: {plan.workload} on {target.describe()}, micro-batch "
          f"{plan.micro_batch_size}, global batch {plan.batch_size}")
    print(estimate_table(prep.predicted))
    memory = target.gpu.memory_bytes
    peak = prep.predicted["peak_memory_bytes"]
    print(f"{'fits' if peak <= memory else 'does not fit'}: {format_bytes(peak)} of the "
          f"{format_bytes(memory)} a process may use on one {target.gpu.label}")
    print(PREDICTIONS + ".")
    return 0


# --- harness plan STUDY --target ---------------------------------------------------------


@dataclass
class Ranked:
    params: dict[str, Any]
    plan: Plan
    rate: float  # predicted samples/s; 0 over the budget or refused
    predicted: dict[str, Any] | None
    peak: float | None  # the peak the search compares with the budget
    why_not: str = ""  # refused by the target: the reason


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="rank a study's configurations on a GPU you do not have: "
                                    "predictions only, nothing is run")
    p.add_argument("study", nargs="?", help="study file (TOML)")
    add_target_flags(p, "GPUs the configurations may use (default: the study's largest world "
                        "size); the study's world sizes become this one")
    p.add_argument("--top", type=int, default=10, help="rows to print (default 10)")
    p.add_argument("--memory-budget", metavar="SIZE|FRACTION",
                   help="per GPU, e.g. 70GiB or 0.9 (default: the study's budget.memory)")
    p.add_argument("--sample", type=int, default=256, metavar="N",
                   help="rank all of a space of up to N configurations, else a seeded sample "
                        "of N (default 256)")
    p.add_argument("--json", action="store_true", help="the ranked rows as JSON")
    p.add_argument("--list-targets", action="store_true", help="the known targets and exit")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from training_harness.estimator.target import Target, target_table

    if args.list_targets:
        print(target_table())
        return 0
    if not args.study or not args.target:
        raise HarnessError("give a study file and --target, e.g. harness plan "
                           "studies/gpt-1b-8gpu.toml --target h100-sxm-80gb --gpus 8")
    if args.top < 1 or args.sample < 1:
        raise HarnessError("--top and --sample: give 1 or more")
    started = time.monotonic()
    Target.named(args.target)  # an unknown name: the known ones, before anything is read
    study = _study(args)
    target = Target.named(args.target, max(study.layout.world_sizes))
    ranked, budget, space_size = rank(study, target, args.memory_budget, args.sample)
    if args.json:
        print(json.dumps([_row_json(r) for r in ranked[:args.top]], indent=2))
        return 0
    print(render(study, target, ranked, budget, space_size, args.top,
                 time.monotonic() - started))
    return 0


def _study(args: argparse.Namespace) -> Any:
    from training_harness.study.study_file import Study

    study = Study.from_toml(args.study)
    if args.gpus is not None:
        if args.gpus < 1:
            raise HarnessError(f"--gpus {args.gpus}: give 1 or more")
        study.layout.world_sizes = [args.gpus]
        study.layout.nnodes = 1
        study.layout.validate("--gpus")
    study.device = "cuda"
    return study


def rank(study: Any, target: Any, memory_budget: Any, sample: int
         ) -> tuple[list[Ranked], int, int | None]:
    """Every configuration of `study` (a seeded sample of `sample` of a larger space),
    rated as the search rates them before any trial, fastest first; the memory budget
    in bytes, and the space's size."""
    from training_harness.strategies import registry
    from training_harness.study.checks import check_study, resolve_settings
    from training_harness.study.machine_facts import MachineFacts
    from training_harness.study.search_space import SearchSpace
    from training_harness.tune.budget import memory_budget_bytes
    from training_harness.tune.model.correction import Correction
    from training_harness.tune.model.estimator_model import Predictions, first_guess_pool

    runtime = target.runtime()
    check_study(study, "cuda")
    settings = resolve_settings(study, "cuda", env=runtime)
    space = SearchSpace(study, "cuda", settings)
    memory = int(target.gpu.memory_bytes)
    facts = MachineFacts(device_type="cuda", device_name=runtime.device_name,
                         device_count=runtime.device_count, device_memory_bytes=memory,
                         settings=settings, known_good=study.known_good,
                         defaults={s.name: s.defaults() for s in registry.all_strategies()})
    budget = memory_budget_bytes(memory_budget if memory_budget is not None
                                 else study.budget.memory, memory)
    if budget < 1:
        raise HarnessError(f"--memory-budget {memory_budget!r}: less than a byte; give a "
                           "size such as 70GiB or a fraction such as 0.9")
    predictor = TargetPredictor(target)
    predictions = Predictions(space, facts, predictor)
    fresh = Correction.from_records([], "cuda")  # the search's rating before any trial
    rows = []
    for params in first_guess_pool(space, study.seed, sample)[:sample]:
        plan, predicted = predictions.raw(params)
        rate = predictions.rate(params, fresh, budget)
        rows.append(Ranked(params, plan, rate, predicted, fresh.peak_memory(predicted),
                           "" if predicted else _refusal(predictor, plan)))
    rows.sort(key=lambda r: (-r.rate, r.peak if r.peak is not None else float("inf")))
    return rows, budget, space.size()


def _refusal(predictor: TargetPredictor, plan: Plan) -> str:
    try:
        predictor.prepare(plan)
    except HarnessError as e:
        return str(e).split(";")[0]
    return ""


def _row_json(r: Ranked) -> dict[str, Any]:
    return {"params": r.params, "plan": r.plan.to_dict(), "samples_per_s": r.rate or None,
            "step_time_s": r.plan.batch_size / r.rate if r.rate else None,
            "peak_memory_bytes": r.peak, "fits": bool(r.rate), "refused": r.why_not or None,
            "predicted": r.predicted}


def render(study: Any, target: Any, ranked: list[Any], budget: int, space_size: int | None,
           top: int, seconds: float) -> str:
    """`harness plan`'s printout: the ranked predictions as a table that says what they are."""
    from training_harness.records.plan_text import describe_plan, varying

    fit = [r for r in ranked if r.rate > 0]
    over = [r for r in ranked if r.rate <= 0 and r.predicted]
    refused = [r for r in ranked if not r.predicted]
    of = (f"all {len(ranked):,}" if space_size is not None and len(ranked) >= space_size
          else f"a seeded sample of {len(ranked):,} of "
               + (f"{space_size:,}" if space_size is not None else "its (ranges: unbounded)"))
    lines = [
        f"plan {study.name}: {study.workload} on {target.describe()}",
        f"PREDICTED, NOT MEASURED: {PREDICTIONS}.",
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
        step = r.plan.batch_size / r.rate if r.rate else (r.predicted or {}).get("step_time_s")
        per = ((r.predicted or {}).get("target") or {}).get("tokens_per_sample")
        tokens = f"{r.rate * per:,.0f}" if per and r.rate else "-"
        rate = f"{r.rate:,.1f}" if r.rate else "-"
        lines.append(f"  {i:>3}  {rate:>10}  {tokens:>10}  {format_seconds(step):>9}  "
                     f"{format_bytes(r.peak):>10}  {'yes' if r.rate else 'no':>4}  "
                     f"{describe_plan(r.plan.to_dict(), differ)}")
    if refused:
        reasons = Counter(r.why_not for r in refused)
        lines.append("refused on this target: " + "; ".join(
            f"{n} x {why}" for why, n in reasons.most_common(3)))
    lines.append("peak mem: what the device would hold (tensors + CUDA context and workspaces "
                 "measured on an H100); step and samples/s: the estimator's model at MFU "
                 "0.5 of the datasheet peak plus launches and communication, uncorrected")
    return "\n".join(lines)
