"""What the rank server (training_harness.launch.rank_server) imports once, before it forks.

Importing this module is the server's preload: torch, torch._dynamo (every
torch.optim optimizer imports it, in its constructor and at each step, so a trial
cannot skip it), the strategies and the rank's own modules. The server imports it,
and so does a rank started as a new interpreter (training_harness.measure.rank_main), so that
both run a trial on the same heap.

The imports run with Python's cyclic garbage collector paused, then frozen
(training_harness.core.paused_imports): each fork keeps collecting its own objects as any
process does, without sweeping (and so copying on write) the server's. What a trial
runs is unchanged.
"""

from __future__ import annotations

from training_harness.core.paused_imports import import_paused

MODULES = ("torch", "torch._dynamo", "strategies", "training_harness.measure.rank_main",
           "training_harness.measure.trial_loop")

import_paused(*MODULES)
