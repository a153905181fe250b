"""What the registry refuses for a study's workload, found before the search starts.

The parallel strategies' checks depend on the layout and the model (tensor parallel
on GPT-2's fused c_attn, a pipeline on a model that cannot be cut, heads that do not
divide over 4 ranks), so they are asked here once per layout the study allows, with
the study's own workload, batches and the other parallel strategies that layout
turns on. A layout on which a strategy it needs is refused for every value of its
searched settings and every micro-batch is recorded in that strategy's
`SettingsSpace.refused` (layout key -> reason), and the search space leaves the
layout out (training_harness.study.search_space); a searched value refused on every layout
is taken out of its choices and listed in `left_out`, as the device's refusals are;
one refused on some layouts only (zero stage 1 beside tensor parallel) is not
offered on those (`layout_values`).
Runs in the tuner's torch-side helper (it imports the strategies).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.core.space import Choice, SettingsSpace
from training_harness.study.study_file import Study

DATA_PARALLEL = ("ddp", "zero")
MAX_COMBINATIONS = 64  # of one strategy's searched choices; beyond, the first value of each


def uses(name: str, layout: Layout) -> bool:
    """Whether a layout turns the structural strategy `name` on."""
    if name in DATA_PARALLEL:
        return layout.data > 1
    return getattr(layout, name) > 1  # "pipeline", "tensor"


def _combinations(space: SettingsSpace) -> tuple[list[dict[str, Any]], bool]:
    """Every combination of the searched choices (with the fixed settings), and whether
    that is all of them (beyond MAX_COMBINATIONS: the first value of each only)."""
    choices = {k: v.values for k, v in space.searched.items() if isinstance(v, Choice)}
    complete = math.prod(len(v) for v in choices.values()) <= MAX_COMBINATIONS
    if not complete:
        choices = {k: v[:1] for k, v in choices.items()}
    keys = list(choices)
    return [{**space.fixed, **dict(zip(keys, values, strict=True))}
            for values in itertools.product(*(choices[k] for k in keys))], complete


def _plans(study: Study, layout: Layout, name: str, settings: dict[str, Any],
           spaces: dict[str, SettingsSpace]):
    """The plans `name` with `settings` is checked against on `layout`: each global
    batch and micro-batch the space can give it, the layout's other parallel
    strategies at their fixed settings."""
    others = {n: dict(spaces[n].fixed) for n in ("pipeline", "tensor")
              if n != name and n in spaces and uses(n, layout)}
    for g in study.global_batches:
        for m in study.micro_sizes:
            if g % (m * layout.data) == 0:
                yield Plan(workload=study.workload, workload_args=dict(study.workload_args),
                           device=study.device, layout=layout, micro_batch_size=m,
                           global_batch_size=g, strategies={**others, name: settings})


def _reasons(strategy, settings: dict[str, Any], plans: list[Plan], env: RuntimeEnv
             ) -> list[str]:
    """[] when some plan runs `settings`, else the first plan's reasons."""
    parsed = strategy.parse(settings, f"[strategies.{strategy.name}]")
    first = None
    for plan in plans:
        reasons = strategy.check(parsed, plan, env)
        if not reasons:
            return []
        first = first or reasons
    return first or []


def refuse_by_layout(study: Study, spaces: dict[str, SettingsSpace], env: RuntimeEnv) -> None:
    """Fill `refused` and `layout_values`, and narrow the searched choices, of each
    structural strategy in `spaces` (training_harness.study.checks.resolve_settings' result)."""
    from training_harness.strategies import registry

    for name, space in spaces.items():
        if name not in (*DATA_PARALLEL, "pipeline", "tensor"):
            continue
        strategy = registry.get(name)
        layouts = [lay for lay in study.layout.layouts() if uses(name, lay)]
        runs: dict[str, set[tuple[str, Any]]] = {}  # layout -> (setting, value) that ran
        why_not: dict[tuple[str, Any], str] = {}
        combos, complete = _combinations(space)
        for lay in layouts:
            key, first = lay.key, None
            for settings in combos:
                searched = [(k, v) for k, v in settings.items() if k in space.searched]
                reasons = _reasons(strategy, settings,
                                   list(_plans(study, lay, name, settings, spaces)), env)
                if not reasons:
                    runs.setdefault(key, set()).update(searched)
                else:
                    first = first or reasons[0]
                    for item in searched:
                        why_not.setdefault(item, reasons[0])
            if key not in runs and first is not None:
                space.refused[key] = first
        if runs and complete:  # some layout runs it: narrow its values, everywhere and per layout
            _narrow(name, space, set().union(*runs.values()), why_not)
            _per_layout(space, runs)


def _narrow(name: str, space: SettingsSpace, runs: set, first_reason: dict) -> None:
    for setting, dist in space.searched.items():
        if not isinstance(dist, Choice):
            continue
        keep = tuple(v for v in dist.values if (setting, v) in runs)
        if keep and len(keep) < len(dist.values):
            for v in dist.values:
                if v not in keep:
                    why = first_reason.get((setting, v), "refused on every layout")
                    space.left_out.append(f"{name}.{setting} = {v!r} ({why})")
            space.searched[setting] = Choice(keep)


def _per_layout(space: SettingsSpace, runs: dict[str, set]) -> None:
    """The values a layout runs where they are fewer than the space's (zero stage 1,
    DDP inside, beside tensor or pipeline parallel)."""
    for key, ran in runs.items():
        for setting, dist in space.searched.items():
            if isinstance(dist, Choice):
                here = [v for v in dist.values if (setting, v) in ran]
                if len(here) < len(dist.values):
                    space.layout_values.setdefault(key, {})[setting] = here
