"""Trials that span several nodes: the tuner on node 0 leads, a follower on each other node joins.

A study with layout.nnodes = N > 1 launches every trial with torchrun on N nodes.
The tuner (node 0) picks a rendezvous endpoint for each trial (its own address
and a free port) and announces the trial in the Optuna storage, as the study's
user attribute "rendezvous", before launching its own node's ranks:

    {"trial_id", "endpoint", "prepared", "command", "timeout_s", "done": false}

(`prepared`: the plan as the leader checked it, training_harness.core.prepared; the
followers run it as it is.)

A follower, `harness tune STUDY --storage URL --follow --node-rank K` on node K,
polls that attribute and launches the same plan with --node-rank K on the same
endpoint; torchrun's c10d rendezvous waits until all N nodes have joined. The
record is made on node 0; the follower keeps its node's logs in its own run
folder (trials/<id>/logs/node<K>/). When the tuner ends it announces
{"finished": true} and the followers end too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from training_harness.core.errors import HarnessError
from training_harness.core.prepared import PreparedPlan
from training_harness.launch.launcher import Launcher
from training_harness.records.run_store import RunStore
from training_harness.tune.budget import Clock
from training_harness.tune.checked_study import CheckedStudy
from training_harness.tune.options import SessionOptions
from training_harness.tune.progress import Progress
from training_harness.tune.storage import make_storage

KEY = "rendezvous"
POLL_S = 0.5


class Announcer:
    """The leader's side: say which trial the followers must join, and when it is over."""

    def __init__(self, optuna_study: optuna.Study, host: str, nnodes: int):
        self.optuna_study, self.host, self.nnodes = optuna_study, host, nnodes

    def launch_kwargs(self, trial_id: Any, prepared: PreparedPlan, command: str,
                      timeout_s: float) -> dict[str, Any]:
        from training_harness.core.ports import free_port

        endpoint = f"{self.host}:{free_port('0.0.0.0')}"
        self.optuna_study.set_user_attr(KEY, {
            "trial_id": str(trial_id), "endpoint": endpoint,
            "prepared": prepared.to_dict(),
            "command": command, "timeout_s": timeout_s, "done": False,
        })
        return {"nnodes": self.nnodes, "node_rank": 0, "rdzv_endpoint": endpoint}

    def done(self, trial_id: Any) -> None:
        current = self.optuna_study.user_attrs.get(KEY) or {}
        if current.get("trial_id") == str(trial_id):
            self.optuna_study.set_user_attr(KEY, {**current, "done": True})

    def finished(self) -> None:
        self.optuna_study.set_user_attr(KEY, {"finished": True})


def follow(optuna_study: optuna.Study, store: RunStore, node_rank: int, nnodes: int,
           deadline: float, launcher: Launcher,
           say: Callable[[str], None] = print) -> str:
    """Join each trial the leader announces, until it finishes or the deadline."""
    seen: set[tuple[str, str]] = set()  # (trial, endpoint): a trial measured again is new
    while time.time() < deadline:
        info = optuna_study.user_attrs.get(KEY) or {}
        if info.get("finished"):
            return "the tuner on node 0 finished"
        trial_id = info.get("trial_id")
        key = (trial_id, info.get("endpoint"))
        if trial_id and not info.get("done") and key not in seen:
            seen.add(key)
            say(f"trial {trial_id}: joining at {info['endpoint']}")
            result = launcher.launch(
                PreparedPlan.from_dict(info["prepared"]), store.trial_dir(trial_id),
                info["command"],
                study=optuna_study.study_name, trial_id=trial_id, nnodes=nnodes,
                node_rank=node_rank,
                rdzv_endpoint=info["endpoint"],
                timeout_s=max(1.0, min(info["timeout_s"], deadline - time.time())),
            )
            say(f"trial {trial_id}: {result.status} on node {node_rank}")
        time.sleep(POLL_S)
    return "deadline"


def run_follower(options: SessionOptions, checked: CheckedStudy) -> int:
    """`harness tune --follow` on node K > 0: join the trials node 0's tuner launches."""
    study, store = checked.study, RunStore(checked.run_dir)
    storage = make_storage(options.storage, store.root, study.storage)
    store.root.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    clock = Clock.start(study.budget.time_s, 0.0, checked.started)
    optuna_study = None
    while optuna_study is None and clock.left() > 0:  # node 0's tuner may not have made it yet
        try:
            optuna_study = optuna.load_study(study_name=study.name, storage=storage)
        except KeyError:
            time.sleep(1.0)
    if optuna_study is None:
        raise HarnessError(f"no study '{study.name}' appeared in the storage within the budget")
    title = f"{study.name} (node {options.node_rank})"
    with Progress(title, clock, quiet=options.quiet) as progress:
        why = follow(optuna_study, store, options.node_rank, study.layout.nnodes, clock.deadline,
                     checked.launcher, say=progress.line)
        progress.line(f"follower ended: {why}")
    return 0
