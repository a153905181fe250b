"""Imports made with Python's cyclic garbage collector paused, then frozen.

A process that starts by importing torch (and torch._dynamo, transformers...) creates
about a million objects and no garbage worth collecting; a collector sweeping the
growing heap every few hundred allocations costs a third of that import's CPU time
here (2.0 against 3.0 CPU-s for a rank's imports, 1.0 against 1.6 for torchrun's
agent). At the end the objects are frozen (`gc.freeze`, the prefork pattern of
Python's gc docs) and the collector is back on: later collections skip them, and
what the process runs next collects its own objects as usual.

Used by the rank server's preload (training_harness.measure.rank_preload) and by the fresh
interpreters that start a trial's ranks or run them: torchrun's agent
(training_harness.launch.torchrun_agent), a rank that is not a fork
(training_harness.measure.rank_main),
the Trainer's run of `harness verify` (training_harness.export.hf_run).
"""

from __future__ import annotations

import gc
import importlib


def import_paused(*modules: str) -> None:
    """Import `modules` with the collector paused, then freeze what they made."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        gc.freeze()  # before enabling: the first collection would sweep all of it
        if was_on:
            gc.enable()
