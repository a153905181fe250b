"""The model's parameters (`ModelFacts`), read once per workload object: no setting of a
plan changes them, and ranking a study's configurations (`harness plan`) estimates one
workload hundreds of times (an 8B model's build on the meta device takes seconds).
The traced forward passes are kept likewise, in harness.estimator.trace.

The key is the workload object itself, weakly: a new workload object (the tuner's helper
loads one per plan) is a new entry. ModelFacts is frozen, so it is shared as it is.
"""

from __future__ import annotations

import weakref
from typing import Any

from harness.estimator.facts import ModelFacts
from harness.workloads.base import Workload

_FACTS: weakref.WeakKeyDictionary[Any, ModelFacts] = weakref.WeakKeyDictionary()


def model_facts(workload: Workload, lora: Any = None) -> ModelFacts:
    """ModelFacts.of(workload, lora), read once per workload (LoRA's adapters: each time)."""
    if lora is not None:
        return ModelFacts.of(workload, lora)
    try:
        if workload not in _FACTS:
            _FACTS[workload] = ModelFacts.of(workload)
        return _FACTS[workload]
    except TypeError:  # not hashable or not weakly referable: nothing kept
        return ModelFacts.of(workload)
