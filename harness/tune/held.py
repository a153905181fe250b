"""The trials this worker holds: from the moment each is RUNNING in the storage until
its record is written (several when trials run as jobs in flight at once).

When the storage gives up on an unreachable database (StorageUnreachable, after
storage.patience), each held trial gets a `failed` record (tags orphan and
unreachable: FAIL for Optuna) before the worker stops; once the database is back,
recovery (training_harness.tune.recovery.resume) tells Optuna so and queues the configuration
again. So every trial in the storage ends with exactly one record, whatever moment the
database goes away. (PatientStorage reports the trial that ask() takes before ask()
returns, and tags a trial that ask() creates with its worker as it is created.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Held:
    """A trial this worker holds: RUNNING in the storage, no record yet."""

    number: int
    trial_id: int | str
    phase: str = "search"
    plan: dict[str, Any] | None = None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(
        timespec="seconds"))


class HeldTrials:
    """This worker's held trials, by Optuna number. Threads of trials in flight share it."""

    def __init__(self) -> None:
        self.trials: dict[int, Held] = {}

    def hold(self, number: int, trial_id: int | str | None = None, phase: str = "search",
             plan: dict[str, Any] | None = None) -> Held:
        """From now until its record is written, trial `number` is this worker's to record."""
        if number not in self.trials:
            self.trials[number] = Held(number, number if trial_id is None else trial_id,
                                       phase, plan)
        return self.trials[number]

    def claimed(self, trial: Any) -> None:
        """PatientStorage's on_claim: ask() has taken this queued trial (a FrozenTrial)."""
        attrs = trial.user_attrs
        self.hold(trial.number, attrs.get("trial_id"), attrs.get("phase", "search"),
                  attrs.get("plan"))

    def release(self, held: Held) -> None:
        """`held` is no longer this worker's to record (its block ended)."""
        if self.trials.get(held.number) is held:
            del self.trials[held.number]

    def recorded(self, number: int) -> None:
        """Trial `number`'s record is written: nothing more to write if the storage goes."""
        self.trials.pop(number, None)

    def give_up(self, write: Callable[[Held, dict[str, Any], str], None]) -> None:
        """Before the worker stops on a lost storage: `write(held, tags, reason)` the
        failed record of every trial still held."""
        for number in list(self.trials):
            held = self.trials.pop(number, None)
            if held is None:  # recorded meanwhile, in another trial's thread
                continue
            tags = {"phase": held.phase, "optuna_number": held.number, "orphan": True,
                    "unreachable": True}
            write(held, tags, "the storage became unreachable while this trial was held "
                              "here, and this worker stopped before it ended; --resume "
                              "queues it to run again")
