"""What the rank server (harness.launch.rank_server) imports once, before it forks.

Importing this module is the server's preload: torch, torch._dynamo (every
torch.optim optimizer imports it, in its constructor and at each step, so a trial
cannot skip it), the strategies and the rank's own modules. Nothing else imports it.

The imports run with Python's cyclic garbage collector paused: torch and dynamo
create about a million objects and no garbage worth collecting, and a collector
that sweeps the growing heap every few hundred allocations costs about an eighth of
the import's CPU time. At the end they are frozen (`gc.freeze`, the prefork
pattern of Python's gc docs) and the collector is back on: each fork keeps
collecting its own objects as any process does, without sweeping (and so copying
on write) the server's. What a trial runs is unchanged.
"""

from __future__ import annotations

import gc
import importlib

MODULES = ("torch", "torch._dynamo", "strategies", "harness.measure.rank_main",
           "harness.measure.trial_loop")


def preload(modules: tuple[str, ...] = MODULES) -> None:
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


preload()
