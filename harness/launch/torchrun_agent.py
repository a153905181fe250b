"""`python -m torch.distributed.run ARGS`, its imports made with the collector paused
(training_harness.core.paused_imports: 1.0 against 1.6 CPU-s): the agent that starts a
trial's ranks on each node of a multi-node trial, and `harness verify`'s ranks.

    python -m training_harness.launch.torchrun_agent ARGS      (ARGS: torchrun's own)
"""

from __future__ import annotations

from training_harness.core.paused_imports import import_paused


def main() -> None:
    import_paused("torch.distributed.run")
    from torch.distributed import run

    run.main()  # reads sys.argv, as `python -m torch.distributed.run` does


if __name__ == "__main__":
    main()
