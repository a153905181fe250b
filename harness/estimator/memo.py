"""The model's parameters (`ModelFacts`), read once per workload object: no setting of a
plan changes them, and ranking a study's configurations (`harness plan`) estimates one
workload hundreds of times (an 8B model's build on the meta device takes seconds).
The traced forward passes are kept likewise, in training_harness.estimator.trace.

The key is the workload object itself, weakly, or, where the caller gives one, the
workload's name and arguments: the tuner's helper loads a new workload object for each
plan it prepares (a study's start prepares dozens), and those build the same model
(training_harness.measure.prepare counts the FLOPs once per name and arguments likewise).
ModelFacts is frozen, so it is shared as it is.
"""

from __future__ import annotations

import weakref
from typing import Any

from training_harness.estimator.facts import ModelFacts
from training_harness.workloads.base import Workload

_FACTS: weakref.WeakKeyDictionary[Any, ModelFacts] = weakref.WeakKeyDictionary()
_BY_KEY: dict[str, ModelFacts] = {}  # by the workload's name and arguments (`key`)


def model_facts(workload: Workload, lora: Any = None, key: str | None = None) -> ModelFacts:
    """ModelFacts.of(workload, lora), read once per workload (LoRA's adapters: each time).
    `key`: the workload's name and arguments, which load the same model in this process."""
    if lora is not None:
        return ModelFacts.of(workload, lora)
    if key is not None:
        if key not in _BY_KEY:
            _BY_KEY[key] = ModelFacts.of(workload)
        return _BY_KEY[key]
    try:
        if workload not in _FACTS:
            _FACTS[workload] = ModelFacts.of(workload)
        return _FACTS[workload]
    except TypeError:  # not hashable or not weakly referable: nothing kept
        return ModelFacts.of(workload)
