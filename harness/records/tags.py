"""The tags a trial's record may carry (TrialResult.tags): where the trial came from in a
study, and what happened to it beyond its status.

On disk a record stays a plain JSON object, and so do its tags: `Tags` names the keys
a record may carry and their types, the constants below are their values, and
`tags_of` reads a stored record's tags. Every key is optional; a trial run by
`harness bench` has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

# tags["phase"]: the part of a study that ran the trial
BASELINE = "baseline"  # the fp32 reference configuration, run first
KNOWN_GOOD = "known-good"  # the known-good configuration, run second
SEARCH = "search"  # proposed by the sampler
CONFIRM = "confirm"  # a confirmation round: a contender for the best measured again
ABLATION = "ablation"  # the best again, with one of its techniques left out (or none)
VARIANT = "variant"  # the best with a precision or compile mode its space left out
Phase = Literal["baseline", "known-good", "search", "confirm", "ablation", "variant"]

# The phases whose trials the search measured (their records are the study's table);
# confirmation and ablation trials measure those configurations again.
REFERENCE_PHASES = (BASELINE, KNOWN_GOOD, SEARCH)

# tags["pruned"]: why a `pruned` record was not measured to the end
PRUNED_MEMORY = "memory"  # predicted over the memory budget: not launched
PRUNED_REFUSED = "refused"  # this machine cannot run the plan: not launched
PRUNED_SLOW = "slow"  # stopped early for being slower than the study's best so far
PRUNED_TIME = "time"  # expected to end after the study's deadline: not started
Pruned = Literal["memory", "refused", "slow", "time"]


class ConfirmTag(TypedDict):
    of: str  # the trial id whose configuration this round measures again
    round: int


class AblationTag(TypedDict):
    of: int | str  # the best trial's id
    without: str | None  # the technique turned off; None: the best itself
    repeat: int


class VariantTag(TypedDict):
    of: str  # the best trial's id
    change: str  # what differs from it ("precision bf16", "compile mode reduce-overhead")


class Tags(TypedDict, total=False):
    phase: Phase  # the part of the study that ran it (BASELINE ... ABLATION)
    optuna_number: int  # its trial number in the Optuna study
    pruned: Pruned  # a `pruned` record: why (PRUNED_MEMORY ... PRUNED_TIME)
    deadline: bool  # stopped at the study's deadline (its timeout was the time left)
    orphan: bool  # never ended: its worker died or stopped while it ran (recorded `failed`)
    unreachable: bool  # an orphan whose worker stopped because the storage went away
    stale: bool  # an orphan that Optuna failed for its missing heartbeat
    retry_of: int  # the Optuna number of the orphan this trial runs again
    duplicate_of: int | str | None  # the trial id whose record this repeats, not measured again
    remeasured: dict[str, Any]  # measured again for a busy machine: the first figure, the wait
    confirm: ConfirmTag  # a confirmation round's trial (phase CONFIRM)
    ablation: AblationTag  # an ablation trial (phase ABLATION)
    variant: VariantTag  # a variant of the best (phase VARIANT)
    cluster: dict[str, Any]  # run as a Slurm job: launcher, job id, nodes, partition, queue wait


def tags_of(record: Mapping[str, Any]) -> Tags:
    """A stored record's tags: {} when it has none (or null)."""
    return record.get("tags") or {}
