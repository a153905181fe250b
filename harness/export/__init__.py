"""`harness export`: a study's best configuration (or any plan) in another stack's own
config file, and `harness verify`: the study's best re-run inside the Hugging Face
Trainer. One module per stack; `common` holds what they share (the not_expressed
list, the refusal of a plan with nothing a stack can hold).
"""

from __future__ import annotations

from pathlib import Path

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.export.common import STACKS, Export, read_facts


def source_plan(path: str | Path) -> tuple[Plan, Path]:
    """The plan at `path`: a run folder's best.toml, or a plan file; and the folder an
    export goes to by default (beside it)."""
    p = Path(path)
    if p.is_dir():
        best = p / "best.toml"
        if not best.exists():
            raise HarnessError(f"{p}: no best.toml in this run folder (its study found no "
                               "configuration, or it is not a run folder); give a plan file")
        return Plan.from_toml(best), best
    if not p.exists():
        raise HarnessError(f"{p}: no such run folder or plan file")
    return Plan.from_toml(p), p


def export_plan(plan: Plan, stack: str, source: str) -> Export:
    """`plan` as `stack`'s config file; a HarnessError when the stack can hold none of it."""
    from training_harness.export import accelerate, deepspeed, hf_trainer, lightning, torchtitan

    writers = {"hf-trainer": hf_trainer.export, "accelerate": accelerate.export,
               "lightning": lightning.export, "torchtitan": torchtitan.export,
               "deepspeed": deepspeed.export}
    if stack not in writers:
        raise HarnessError(f"--to {stack}: not a stack the harness writes; one of "
                           f"{', '.join(STACKS)}")
    return writers[stack](read_facts(plan), source)


def default_out(source: Path, plan: Plan, stack: str, suffix: str) -> Path:
    """Beside the plan: runs/<study>/best.hf-trainer.json, plans/x.deepspeed.json."""
    return source.with_name(f"{source.stem}.{stack}{suffix}")
