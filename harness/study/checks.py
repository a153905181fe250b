"""Checks of a study against the registry and this machine, before anything runs.

Each strategy's searched settings are resolved here: the study's `search`,
`values` and `fixed` against the strategy's own space and settings, keeping only
values this device can run (fp16 and Triton need CUDA: on a CPU they are left
out, unless the study asked for them by name, which is an error); the parallel
strategies are checked layout by layout on the study's workload (training_harness.study.refusals).
"""

from __future__ import annotations

import math
from typing import Any

from training_harness.core.config import from_table, to_table
from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.core.space import Choice, FloatRange, IntRange, SettingsSpace, Space
from training_harness.study.study_file import Study

STRUCTURAL = {"ddp", "zero", "pipeline", "tensor"}


def resolve_settings(study: Study, device_type: str,
                     env: RuntimeEnv | None = None) -> dict[str, SettingsSpace]:
    """`env`: the device to check against (`harness plan --target`'s); this machine's
    by default."""
    from training_harness.strategies import registry

    env = env or RuntimeEnv.detect(device_type)
    out = {}
    for name, spec in study.strategies.items():
        where = f"strategies.{name}"
        try:
            strategy = registry.get(name)
        except HarnessError as e:
            raise HarnessError(f"{where}: {e}") from None
        if name == "accumulation":
            raise HarnessError(f"{where}: accumulation follows from the micro-batch size and the "
                               "global batch; remove [strategies.accumulation]")
        if spec.always and name in STRUCTURAL:
            raise HarnessError(f"{where}.always: {name} is on exactly when the layout needs it; "
                               "remove the key")
        strategy.parse(spec.fixed, f"{where}.fixed")
        own = strategy.space()
        searched_names = list(own) if spec.search is None else list(spec.search)
        for key in spec.values:
            if key not in searched_names:
                raise HarnessError(f"{where}.values.{key}: not searched; add it to search")
        space = SettingsSpace(fixed=dict(spec.fixed), defaults=strategy.defaults())
        for setting in searched_names:
            key = f"{where}.search"
            if setting in spec.fixed:
                raise HarnessError(f"{key}: '{setting}' is also in fixed; keep it in one")
            if setting not in spec.values and setting not in own:
                known = ", ".join(own) or "none"
                raise HarnessError(f"{key}: '{setting}' has no search space of its own (searched "
                                   f"by default: {known}); give its values in "
                                   f"[{where}.values]")
            dist = (_narrowed(strategy, setting, spec.values[setting], f"{where}.values.{setting}")
                    if setting in spec.values else own[setting])
            given = setting in spec.values
            space.searched[setting] = _runnable(strategy, setting, dist, env, given,
                                                f"{where}.values.{setting}", space.left_out)
        out[name] = space
    from training_harness.study.refusals import refuse_by_layout

    refuse_by_layout(study, out, env)  # the parallel strategies, layout by layout
    return out


def _narrowed(strategy, setting: str, values: Any, key: str) -> Space:
    """The values of `setting` a study narrows it to: a list, or a numeric range."""
    parent = key.rpartition(".")[0]  # the settings table: its errors add ".setting"

    def parsed(v: Any) -> Any:
        return getattr(strategy.parse({setting: v}, parent), setting)

    if isinstance(values, list) and values:
        return Choice(tuple(dict.fromkeys(parsed(v) for v in values)))
    if isinstance(values, dict) and {"low", "high"} <= values.keys():
        if extra := sorted(values.keys() - {"low", "high", "log"}):
            raise HarnessError(f"{key}: unknown key '{extra[0]}' in a range; known keys: "
                               "high, log, low")
        low, high = parsed(values["low"]), parsed(values["high"])
        log = values.get("log", False)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
               for v in (low, high)):
            raise HarnessError(f"{key}: a range needs finite numbers for low and high; for "
                               "other settings give a list of values")
        if not isinstance(log, bool):
            raise HarnessError(f"{key}.log: expected true or false, got {log!r}")
        if high < low:
            raise HarnessError(f"{key}: high must be at least low")
        if log and low <= 0:
            raise HarnessError(f"{key}: a log range needs low above 0")
        is_int = type(low) is int and type(high) is int
        return (IntRange if is_int else FloatRange)(low, high, log)
    raise HarnessError(f"{key}: give a list of values, or {{ low = ..., high = ... }}")


def _runnable(strategy, setting: str, dist: Space, env: RuntimeEnv, given: bool, key: str,
              left_out: list[str]) -> Space:
    """Drop the choices this device refuses (checked on a one-rank plan; the
    distributed strategies' checks depend on the layout and are left to each trial)."""
    if strategy.distributed or not isinstance(dist, Choice):
        return dist
    keep = []
    for v in dist.values:
        settings = strategy.parse({setting: v}, key)
        reasons = strategy.check(settings, Plan(device=env.device_type), env)
        if not reasons:
            keep.append(v)
        elif given:
            raise HarnessError(f"{key}: {v!r} cannot run here: {reasons[0]}")
        else:
            left_out.append(f"{strategy.name}.{setting} = {v!r} ({reasons[0]})")
    if not keep:
        raise HarnessError(f"{key}: no value of {strategy.name}.{setting} runs here; "
                           f"fix it in [strategies.{strategy.name}.fixed]")
    return Choice(tuple(keep))


def check_study(study: Study, device_type: str) -> None:
    """Everything about `study` that can be known before a trial runs."""
    from training_harness.workloads import load_workload

    try:
        load_workload(study.workload, study.workload_args)
    except HarnessError as e:  # its messages say "[workload]" or "workload 'name'"
        raise HarnessError(str(e) if "workload" in str(e) else f"workload: {e}") from None
    names = set(study.strategies)
    for lay in study.layout.layouts():
        where = (f"layout: data {lay.data} x pipeline {lay.pipeline} x tensor {lay.tensor} "
                 f"(world size {lay.world_size})")
        if lay.data > 1 and not names & {"ddp", "zero"}:
            raise HarnessError(f"{where} needs a data-parallel strategy; add [strategies.ddp] "
                               "or [strategies.zero], or allow only layouts with data = 1")
        for axis in ("pipeline", "tensor"):
            if getattr(lay, axis) > 1 and axis not in names:
                raise HarnessError(f"{where} needs [strategies.{axis}]; add it, or set "
                                   f"layout.{axis} = [1]")
        for g in study.global_batches:
            if not any(g % (m * lay.data) == 0 for m in study.micro_sizes):
                raise HarnessError(
                    f"{where}: no micro-batch of {study.micro_sizes} x data {lay.data} divides "
                    f"global_batch_size {g}; change global_batch_size or micro_batch_sizes")
    if study.known_good is not None:
        _check_known_good(study)


def _check_known_good(study: Study) -> None:
    from training_harness.strategies import registry

    kg = study.known_good or {}
    allowed = {"micro_batch_size", "layout", "strategies"}
    for key in kg:
        if key not in allowed:
            raise HarnessError(f"known_good: unknown key '{key}'; known keys: "
                               f"{', '.join(sorted(allowed))}")
    if "layout" in kg:
        lay = from_table(Layout, kg["layout"], "known_good.layout")
        kg["layout"] = to_table(lay)
        if lay not in study.layout.layouts():
            raise HarnessError("known_good.layout: not one of the layouts the study allows")
    micro = kg.get("micro_batch_size")
    if "micro_batch_size" in kg and (type(micro) is not int or micro not in study.micro_sizes):
        raise HarnessError(f"known_good.micro_batch_size: {micro!r} is not one of "
                           f"micro_batch_sizes {study.micro_sizes}")
    chosen = kg.get("strategies", {})
    if not isinstance(chosen, dict):
        raise HarnessError("known_good.strategies: expected a table such as "
                           "{ amp = { dtype = \"bf16\" } }")
    for name, settings in chosen.items():
        if name not in study.strategies:
            raise HarnessError(f"known_good.strategies.{name}: not searched by this study; "
                               f"add [strategies.{name}]")
        if not isinstance(settings, dict):
            raise HarnessError(f"known_good.strategies.{name}: expected a table of settings")
        try:
            strategy = registry.get(name)
        except HarnessError as e:
            raise HarnessError(f"known_good.strategies.{name}: {e}") from None
        strategy.parse(settings, f"known_good.strategies.{name}")
