"""What the rank server (harness.launch.rank_server) imports when it serves only the
tuner's torch-side helper: a study whose trials run elsewhere (Slurm jobs, torchrun
across nodes, a user's launcher) forks no rank from it, so torch._dynamo and the
trial loop (harness.measure.rank_preload) would be imported for nothing: about a
third of that server's CPU (1.6 against 2.5 CPU-s on a 2-core Zen 4).

Imported, like the rank's preload, with the garbage collector paused
(harness.core.paused_imports).
"""

from __future__ import annotations

from harness.core.paused_imports import import_paused

MODULES = ("torch", "strategies", "harness.measure.prepare",
           "harness.measure.torch_helper_server")

import_paused(*MODULES)
