"""The conditional search space of a study: an Optuna trial's parameters -> a Plan.

One walk (`walk`) decides the structure, and every use goes through it, so they
cannot disagree: sampling a trial, rebuilding a plan from stored parameters,
turning a wanted configuration into parameters (the baseline, the known-good one,
ablations), and listing every configuration of a finite space.

    global_batch_size      when the study lists several (objective time_to_loss)
    optimizer, lr,         with target_loss: the [target] table's choices
    lr_scaling,            (training_harness.study.target_search); each a parameter only
    warmup_samples         when it has several values
    layout                 d{data}p{pipeline}t{tensor}, only layouts that divide a
                           world size (one layout: no parameter)
    data_parallel          ddp or zero, when data > 1 and the study lists both
                           (@{layout} where one is refused on that layout)
    micro_batch_size       only sizes where micro x data divides the global batch
                           (named micro_batch_size@data{d} when data sizes differ,
                           and @batch{g} when global batches do, since an Optuna
                           parameter keeps one set of choices)
    <strategy>             on or off, for each searched strategy
    <strategy>.<setting>   only when that strategy is on (@{layout} where some of
                           its values are refused on that layout)

What the registry refuses for the study's workload is not offered
(training_harness.study.refusals): layouts whose parallel strategies cannot run, values no
layout runs; `left_out` says which and why.

Pipeline and tensor parallel are on exactly when their layout axis is above 1;
accumulation is added whenever a step takes several micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.core.space import Choice, FloatRange, IntRange, SettingsSpace, Space
from training_harness.study.study_file import Study

if TYPE_CHECKING:  # optuna is imported where it is used: `harness bench` needs none of it
    import optuna

DATA_PARALLEL = ("ddp", "zero")
AXIS_STRATEGIES = {"pipeline": "pipeline", "tensor": "tensor"}  # layout axis -> strategy
STRUCTURAL = {*DATA_PARALLEL, *AXIS_STRATEGIES.values()}
TARGET_PARAMS = ("global_batch_size", "optimizer", "lr", "lr_scaling", "warmup_samples",
                 "lr@adamw", "lr@lamb", "lr@lars", "lr@muon")

Ask = Callable[[str, Space], Any]


class NotInSpace(Exception):
    """A wanted configuration is not one the space can produce."""


@dataclass
class Wanted:
    """A configuration named by hand (baseline, known-good, an ablation)."""

    layout: Layout | None = None
    data_parallel: str | None = None
    micro_batch_size: int | None = None
    strategies: dict[str, dict[str, Any]] | None = None  # on, with their settings


class SearchSpace:
    def __init__(self, study: Study, device_type: str, settings: dict[str, SettingsSpace]):
        self.study = study
        self.device_type = device_type
        self.settings = settings  # per listed strategy: searched spaces and fixed values
        names = list(study.strategies)
        self.data_parallel = [s for s in DATA_PARALLEL if s in names]
        self.always = [s for s in names if s not in STRUCTURAL and study.strategies[s].always]
        self.optional = [s for s in names if s not in STRUCTURAL and s not in self.always]
        self.layouts = [lay for lay in study.layout.layouts()
                        if any(self.micros_for(lay, g) for g in study.global_batches)]
        # What the registry refuses for this workload is not offered (said once, by
        # `harness tune`): layouts a parallel strategy cannot run, values no layout runs.
        self.left_out = [line for name in names if name in settings
                         for line in settings[name].left_out]
        self.layouts, self.data_parallel = self._runnable_layouts()
        self._by_key = {lay.key: lay for lay in self.layouts}
        self._one_data = len({lay.data for lay in self.layouts}) == 1
        self._one_batch_micros = all(
            len({tuple(self.micros_for(lay, g)) for g in study.global_batches}) == 1
            for lay in self.layouts)

    def _runnable_layouts(self) -> tuple[list[Layout], list[str]]:
        """The layouts whose parallel strategies run here, and the data-parallel
        strategies that run on some of them; what is left out goes in `left_out`."""
        def refused(name: str, lay: Layout) -> str | None:
            space = self.settings.get(name)
            return space.refused.get(lay.key) if space else None

        kept, why = [], {}
        for lay in self.layouts:
            axes = [r for n in AXIS_STRATEGIES.values()
                    if getattr(lay, n) > 1 and (r := refused(n, lay))]
            dp = [refused(n, lay) for n in self.data_parallel] if lay.data > 1 else []
            if dp and all(dp):
                axes += dp
            if axes:
                why[f"{lay.data}x{lay.pipeline}x{lay.tensor}"] = "; ".join(axes)
            else:
                kept.append(lay)
        data = [n for n in self.data_parallel
                if any(lay.data > 1 and not refused(n, lay) for lay in kept)
                or not any(lay.data > 1 for lay in kept)]
        self.left_out += [f"layout {k} (data x pipeline x tensor): {r}" for k, r in why.items()]
        for n in self.data_parallel:
            if n not in data:  # refused on every kept layout with data > 1
                lay = next(x for x in kept if x.data > 1)
                self.left_out.append(f"{n} on every layout with data > 1: {refused(n, lay)}")
        if not kept:
            raise HarnessError("no layout of the study can run here: "
                               + " | ".join(f"{k}: {r}" for k, r in why.items())
                               + "; change [layout] or [workload]")
        return kept, data

    @classmethod
    def of(cls, study: Study, device_type: str) -> SearchSpace:
        """Resolved in this process, which imports torch: the tuner asks its probe."""
        from training_harness.study.checks import resolve_settings

        return cls(study, device_type, resolve_settings(study, device_type))

    def micros_for(self, layout: Layout, g: int | None = None) -> list[int]:
        g = g or self.study.global_batches[0]
        return [m for m in self.study.micro_sizes if g % (m * layout.data) == 0]

    # --- the one walk ---------------------------------------------------------
    def walk(self, ask: Ask) -> Plan:
        batches = self.study.global_batches
        g = batches[0] if len(batches) == 1 else ask("global_batch_size", Choice(tuple(batches)))
        drawn = self._target_values(ask)
        layout = self.layouts[0]
        if len(self.layouts) > 1:
            layout = self._by_key[ask("layout", Choice(tuple(self._by_key)))]
        strategies: dict[str, dict[str, Any]] = {}
        if layout.data > 1:
            dps = [n for n in self.data_parallel
                   if layout.key not in self.settings[n].refused]
            dp = dps[0]
            if len(dps) > 1:
                dp = ask(self._named("data_parallel", dps != self.data_parallel, layout),
                         Choice(tuple(dps)))
            strategies[dp] = self._settings(dp, ask, layout)
        for axis, name in AXIS_STRATEGIES.items():
            if getattr(layout, axis) > 1:
                strategies[name] = self._settings(name, ask, layout)
        micros = self.micros_for(layout, g)
        if not micros:
            raise NotInSpace(f"no micro-batch of {self.study.micro_sizes} x data {layout.data} "
                             f"divides global batch {g}")
        micro = micros[0]
        if len(micros) > 1:
            name = "micro_batch_size" if self._one_data else f"micro_batch_size@data{layout.data}"
            name += "" if self._one_batch_micros else f"@batch{g}"
            micro = ask(name, Choice(tuple(micros)))
        if drawn.get("optimizer", "adamw") != "adamw":  # lamb, lars, muon: the strategy
            strategies[drawn["optimizer"]] = {}
        for name in self.always:
            strategies[name] = self._settings(name, ask)
        for name in self.optional:
            if ask(name, Choice((False, True))):
                strategies[name] = self._settings(name, ask)
        steps = g // (micro * layout.data)
        if steps > 1 and "pipeline" not in strategies:
            strategies["accumulation"] = {}
        return self._plan(layout, micro, strategies, g, drawn)

    def _target_values(self, ask: Ask) -> dict[str, Any]:
        """With target_loss: the optimizer, lr, lr scaling and warm-up, each asked only
        when it has several values."""
        if self.study.target_loss is None:
            return {}
        target = self.study.target

        def value(name: str, dist: Space) -> Any:
            single = isinstance(dist, Choice) and len(dist.values) == 1
            return dist.values[0] if single else ask(name, dist)

        out = {"optimizer": value("optimizer", Choice(tuple(target.optimizer)))}
        name, dist = target.lr_space(out["optimizer"], self.study.optimizer.lr)
        out["lr"] = value(name, dist)
        return out | {name: value(name, dist) for name, dist in target.rest().items()}

    def _settings(self, name: str, ask: Ask, layout: Layout | None = None) -> dict[str, Any]:
        space = self.settings[name]
        out = dict(space.fixed)
        here = space.layout_values.get(layout.key, {}) if layout else {}
        for setting, dist in space.searched.items():
            fewer = setting in here
            if fewer:  # some values are refused on this layout
                dist = Choice(tuple(v for v in dist.values if v in here[setting]))
            if isinstance(dist, Choice) and len(dist.values) == 1:
                out[setting] = dist.values[0]
            else:
                out[setting] = ask(self._named(f"{name}.{setting}", fewer, layout), dist)
        return out

    @staticmethod
    def _named(name: str, per_layout: bool, layout: Layout) -> str:
        """An Optuna parameter keeps one set of choices: one that differs on a layout
        has its own name there."""
        return f"{name}@{layout.key}" if per_layout else name

    def _plan(self, layout: Layout, micro: int, strategies: dict[str, dict[str, Any]], g: int,
              drawn: dict[str, Any]) -> Plan:
        s = self.study
        optimizer, target = s.optimizer, None
        if s.target_loss is not None:
            optimizer = dataclasses.replace(s.optimizer, lr=drawn["lr"])
            target = s.target.spec(s.target_loss, drawn)
        return Plan(
            name=s.name, workload=s.workload, workload_args=dict(s.workload_args),
            device=s.device, layout=Layout(layout.data, layout.pipeline, layout.tensor),
            micro_batch_size=micro, global_batch_size=g,
            strategies=strategies, optimizer=optimizer, warmup_steps=s.warmup_steps,
            steps=s.steps, seed=s.seed, timeout_s=s.budget.trial_timeout_s, target=target,
        )

    # --- its uses -------------------------------------------------------------
    def suggest(self, trial: optuna.Trial) -> Plan:
        """The plan of `trial`, its parameters sampled (or fixed, for an enqueued trial)."""
        def ask(name: str, dist: Space) -> Any:
            if isinstance(dist, Choice):
                return trial.suggest_categorical(name, list(dist.values))
            if isinstance(dist, IntRange):
                return trial.suggest_int(name, dist.low, dist.high, log=dist.log)
            return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
        return self.walk(ask)

    def plan(self, params: dict[str, Any]) -> Plan:
        """The plan of stored parameters (those the walk does not reach are ignored)."""
        def ask(name: str, dist: Space) -> Any:
            if name not in params:
                raise NotInSpace(f"parameter '{name}' is missing")
            return params[name]
        return self.walk(ask)

    def distributions(self, params: dict[str, Any]) -> dict[str, Any]:
        """Optuna distributions of the parameters `params` uses (for study.add_trial)."""
        out: dict[str, Any] = {}

        def ask(name: str, dist: Space) -> Any:
            out[name] = to_optuna(dist)
            return params[name]
        self.walk(ask)
        return out

    def params_for(self, wanted: Wanted) -> dict[str, Any]:
        """Parameters that give `wanted`; a setting it leaves out takes its default
        (or the first value searched). Raises NotInSpace when it cannot be had."""
        params: dict[str, Any] = {}
        on = wanted.strategies or {}

        def ask(name: str, dist: Space) -> Any:
            want = self._wanted_value(name, dist, wanted, on)
            if isinstance(dist, Choice) and want not in dist.values:
                raise NotInSpace(f"{name} = {want!r} is not among {list(dist.values)}")
            if isinstance(dist, (IntRange, FloatRange)) and not dist.low <= want <= dist.high:
                raise NotInSpace(f"{name} = {want!r} is outside [{dist.low}, {dist.high}]")
            params[name] = want
            return want
        self.walk(ask)
        return params

    def _wanted_value(self, name: str, dist: Space, wanted: Wanted, on: dict) -> Any:
        if name in TARGET_PARAMS:  # the first listed (the study's own lr where it fits)
            if isinstance(dist, Choice):
                return dist.values[0]
            lr = self.study.optimizer.lr
            return lr if dist.low <= lr <= dist.high else dist.low
        if name == "layout":
            return wanted.layout.key if wanted.layout else dist.values[0]
        if name.startswith("micro_batch_size"):
            return wanted.micro_batch_size if wanted.micro_batch_size else dist.values[-1]
        name = name.partition("@")[0]  # a per-layout parameter (data_parallel@d2p1t2)
        if name == "data_parallel":
            return wanted.data_parallel or dist.values[0]
        strategy, _, setting = name.partition(".")
        if not setting:
            return strategy in on
        given = on.get(strategy, {})
        if setting in given:
            return given[setting]
        default = self.settings[strategy].defaults.get(setting)
        if isinstance(dist, Choice):
            return default if default in dist.values else dist.values[0]
        return default if default is not None and dist.low <= default <= dist.high else dist.low

    def enumerate(self) -> list[dict[str, Any]]:
        """Every configuration's parameters (a space of choices only), depth first."""
        found: list[dict[str, Any]] = []
        stack: list[list[int]] = [[]]
        while stack:
            path = stack.pop()
            params: dict[str, Any] = {}
            depth = 0

            def ask(name: str, dist: Space, path: list[int] = path,
                    params: dict[str, Any] = params) -> Any:
                nonlocal depth
                if not isinstance(dist, Choice):
                    raise NotInSpace(f"'{name}' is a range; only choices can be listed")
                if depth == len(path):  # a new branch point: visit the others later
                    stack.extend(path + [j] for j in range(len(dist.values) - 1, 0, -1))
                    path.append(0)
                value = dist.values[path[depth]]
                depth += 1
                params[name] = value
                return value
            self.walk(ask)
            found.append(params)
        return found

    def size(self) -> int | None:
        """How many configurations there are; None for a space with ranges."""
        try:
            return len(self.enumerate())
        except NotInSpace:
            return None


def to_optuna(dist: Space) -> optuna.distributions.BaseDistribution:
    import optuna

    if isinstance(dist, Choice):
        return optuna.distributions.CategoricalDistribution(list(dist.values))
    if isinstance(dist, IntRange):
        return optuna.distributions.IntDistribution(dist.low, dist.high, log=dist.log)
    return optuna.distributions.FloatDistribution(dist.low, dist.high, log=dist.log)


def config_key(plan: Plan | dict[str, Any]) -> str:
    """What makes two plans the same configuration (their name aside)."""
    import json

    table = dict(plan.to_dict() if isinstance(plan, Plan) else plan)
    table.pop("name", None)
    # the study's, not the configuration's: the allocator's cap and its segments
    table.pop("memory_budget_bytes", None)
    table.pop("expandable_segments", None)
    return json.dumps(table, sort_keys=True, default=str)
