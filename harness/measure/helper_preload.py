"""What the rank server (training_harness.launch.rank_server) imports when it serves only the
tuner's torch-side helper: a study whose trials run elsewhere (Slurm jobs, torchrun
across nodes, a user's launcher) forks no rank from it, so torch._dynamo and the
trial loop (training_harness.measure.rank_preload) would be imported for nothing: about a
third of that server's CPU (1.6 against 2.5 CPU-s on a 2-core Zen 4).

Imported, like the rank's preload, with the garbage collector paused
(training_harness.core.paused_imports).
"""

from __future__ import annotations

from training_harness.core.paused_imports import import_paused

MODULES = ("torch", "strategies", "training_harness.measure.prepare",
           "training_harness.measure.torch_helper_server")

import_paused(*MODULES)
