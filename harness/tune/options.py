"""What `harness tune`'s flags say to one session (training_harness.cli.tune builds it):
typed, so that no argparse object reaches the tuner."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionOptions:
    storage: str | None = None  # --storage (else HARNESS_STORAGE, taken by run_session)
    resume: bool = False  # --resume: settle what a stopped tuner left first
    quiet: bool = False  # one line per trial, no live panel
    launcher: str | None = None  # --launcher as given: passed on to helper workers
    helper: bool = False  # a --workers helper, on the main worker's clock:
    search_until: float | None = None  # its search's end (time.time())
    deadline_at: float | None = None  # and its deadline
    follow: bool = False  # node K > 0 of a multi-node study: follow node 0's trials
    node_rank: int = 0
    rdzv_host: str | None = None  # node 0's address, for the others' rendezvous
