"""The two configurations every study starts with, so each has its reference.

    baseline     strict fp32 (TF32 off, torch's default float32 matmul precision
                 "highest"; [strategies.tf32] is the fp32+TF32 one): no technique,
                 the largest world size (data parallel where the layouts allow,
                 with DDP if the study lists it), the largest micro-batch (the least
                 accumulation) predicted to fit the memory budget
                 (training_harness.tune.model.estimator_model.largest_fitting_micro lowers it)
    known-good   the study's [known_good], or else the techniques usually good on
                 this device (GOOD_BY_DEVICE) at their default settings

Both are enqueued in Optuna before the sampler proposes anything.
"""

from __future__ import annotations

from training_harness.core.plan import Layout
from training_harness.study.search_space import DATA_PARALLEL, SearchSpace, Wanted

GOOD_BY_DEVICE = {"cpu": ("fused",), "cuda": ("amp", "fused")}


def baseline(space: SearchSpace) -> Wanted:
    return Wanted(layout=_reference_layout(space), data_parallel=_plain_dp(space),
                  strategies={name: {} for name in space.always})


def known_good(space: SearchSpace) -> Wanted:
    kg = space.study.known_good
    always = {name: {} for name in space.always}
    if kg is not None:
        lay = kg.get("layout")
        chosen = kg.get("strategies", {})
        return Wanted(
            layout=Layout(**lay) if lay else _reference_layout(space),
            data_parallel=next((s for s in DATA_PARALLEL if s in chosen), _plain_dp(space)),
            micro_batch_size=kg.get("micro_batch_size"),
            strategies={**always, **chosen},
        )
    good = [s for s in GOOD_BY_DEVICE.get(space.device_type, ()) if s in space.optional]
    return Wanted(layout=_reference_layout(space), data_parallel=_plain_dp(space),
                  strategies={**always, **{name: {} for name in good}})


def _reference_layout(space: SearchSpace) -> Layout:
    largest = max(lay.world_size for lay in space.layouts)
    same = [lay for lay in space.layouts if lay.world_size == largest]
    return max(same, key=lambda lay: lay.data)


def _plain_dp(space: SearchSpace) -> str | None:
    dp = space.data_parallel
    return "ddp" if "ddp" in dp else next(iter(dp), None)
