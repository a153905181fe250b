"""What every stack's export shares: the plan read with its defaults filled, the record of
what was carried into the stack's file and what could not be (never dropped silently),
and the refusal of a plan with nothing a stack can express.

An exporter walks the plan's choices (micro-batch, accumulation, layout, each strategy)
and for each either writes it in the stack's own names (`carry`) or says why it cannot,
with the nearest equivalent (`lose`). `Writer.finish` checks that every strategy of the
plan was one or the other.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan

STACKS = ("hf-trainer", "accelerate", "lightning", "torchtitan", "deepspeed")


@dataclass
class NotExpressed:
    """A setting of the plan the stack's file cannot hold."""

    setting: str  # as the plan says it: "lamb", "checkpoint.every = 2"
    reason: str  # why the stack cannot say it
    nearest: str  # the nearest equivalent, in the stack's words
    # True: the file holds the nearest equivalent (what the stack then runs), or the setting
    # is how the harness measured rather than what it trained; False: the file lacks it,
    # so the configuration as measured does not run from this file alone
    applied: bool = False

    def line(self) -> str:
        lacking = "" if self.applied else " (not in the file)"
        return f"{self.setting}: {self.reason}; nearest: {self.nearest}{lacking}"


@dataclass
class Export:
    """One stack's file for one plan, and the notes that go beside it (the sidecar): the
    file holds only the stack's own keys, so that it loads with the stack's defaults."""

    stack: str
    text: str  # the file's content
    suffix: str  # ".json", ".yaml", ".toml"
    carried: list[str]  # the plan's choices written in the stack's names
    not_expressed: list[NotExpressed]
    # what the run needs outside the stack's config (hf-trainer: the model's
    # from_pretrained kwargs, the launch command)
    harness: dict[str, Any] = field(default_factory=dict)

    def sidecar(self) -> str:
        """The notes file's JSON: written beside the export as <name>.harness.json."""
        notes = {"stack": self.stack, "harness": self.harness,
                 "not_expressed": [asdict(n) for n in self.not_expressed]}
        return json.dumps(notes, indent=2) + "\n"

    def missing(self) -> list[NotExpressed]:
        """The settings the file lacks outright (no equivalent written)."""
        return [n for n in self.not_expressed if not n.applied]


@dataclass
class Facts:
    """A plan's choices as an exporter reads them: strategies with every default filled."""

    plan: Plan
    strategies: dict[str, dict[str, Any]]

    @property
    def mb(self) -> int:
        return self.plan.micro_batch_size

    @property
    def accumulation(self) -> int:
        return self.plan.accumulation_steps

    @property
    def world(self) -> int:
        return self.plan.world_size

    @property
    def cuda(self) -> bool:
        """Whether the plan runs on GPUs: "auto" exports for a GPU, the stacks' home."""
        return self.plan.device != "cpu"

    def get(self, name: str) -> dict[str, Any] | None:
        return self.strategies.get(name)

    def precision(self) -> str | None:
        """"bf16", "fp16" or None (fp32), from amp."""
        amp = self.get("amp")
        return amp["dtype"] if amp else None


def read_facts(plan: Plan) -> Facts:
    """The plan with its strategies' defaults filled in (strategies.compose.resolved), so
    that an exporter sees what the trial ran, not only what the file spelled out."""
    from training_harness.strategies.compose import resolved

    _ = plan.accumulation_steps  # a batch that does not divide: the plan's own message
    full = resolved(plan)
    return Facts(full, {k: dict(v) for k, v in full.strategies.items()})


@dataclass
class Writer:
    """Collects what an exporter carried and lost, and makes the Export. It starts with
    what every stack's file holds (the processes, amp's dtype) and what none holds (the
    run settings, the implementation of an optimizer that replaces AdamW)."""

    stack: str
    facts: Facts
    carried: list[str] = field(default_factory=list)
    lost: list[NotExpressed] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.facts.world > 1:
            self.carry("layout")
        if self.facts.get("amp"):
            self.carry("amp")
        self.run_settings()
        self.optimizer_impl()

    def carry(self, what: str) -> None:
        self.carried.append(what)

    def lose(self, setting: str, reason: str, nearest: str, applied: bool = False) -> None:
        self.lost.append(NotExpressed(setting, reason, nearest, applied))

    def touched(self, name: str) -> bool:
        """Whether strategy `name` was carried, or one of its settings lost, already."""
        return name in self.carried or any(n.setting.startswith(name) for n in self.lost)

    def lose_rest(self, nearest: dict[str, str], reason: str) -> None:
        """Each strategy of the plan in `nearest` that nothing above carried or lost: lost
        for `reason`, with its nearest equivalent."""
        for name in self.facts.strategies:
            if name in nearest and not self.touched(name):
                self.lose(name, reason, nearest[name])

    def run_settings(self) -> None:
        """The plan's settings of how it was measured that matter to a run elsewhere: the
        allocator's cap and its expandable segments (each stack's file lacks both)."""
        plan = self.facts.plan
        if plan.memory_budget_bytes:
            self.lose(f"memory_budget_bytes = {plan.memory_budget_bytes}", "the harness capped "
                      "each rank's allocator while measuring (the study's memory budget)",
                      "torch.cuda.set_per_process_memory_fraction(...) in your script, for the "
                      "same cap", applied=True)
        if plan.expandable_segments and self.facts.cuda:
            self.lose("expandable_segments = true", "an environment variable of the processes",
                      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where you launch",
                      applied=True)

    def optimizer_impl(self) -> None:
        """The fused strategy's optimizer setting where LAMB, LARS or Muon replaces AdamW:
        it picks that optimizer's implementation (foreach, Triton), which no stack names."""
        opt, fused = optimizer_name(self.facts), self.facts.get("fused")
        if opt != "adamw" and fused and fused["optimizer"] != "default":
            self.lose(f"fused.optimizer = {fused['optimizer']} (of {opt})", "the "
                      f"implementation of the harness's {opt}", f"{opt} as your code builds it")

    def finish(self, text: str, suffix: str, harness: dict[str, Any] | None = None) -> Export:
        touched = set(self.carried) | {n.setting.split(".")[0].split(" ")[0]
                                       for n in self.lost}
        missing = [s for s in self.facts.strategies if s not in touched]
        if missing:  # an exporter's bug, not the user's: say it loudly
            raise AssertionError(f"{self.stack} exporter passed over {missing}")
        if not self.carried:
            lost = "; ".join(n.line() for n in self.lost) or "nothing to write"
            raise HarnessError(f"{self.facts.plan.name}: nothing of this plan can be written "
                               f"in {self.stack}'s config file ({lost}); export it --to "
                               "another stack")
        return Export(self.stack, text, suffix, self.carried, self.lost, harness or {})


def sidecar_path(out: Path) -> Path:
    """best.hf-trainer.json -> best.hf-trainer.harness.json"""
    return out.with_name(f"{out.stem}.harness.json")


def comment_lines(lost: list[NotExpressed], source: str, stack: str) -> str:
    """A YAML/TOML header: where it came from and each setting not expressed."""
    lines = [f"# {stack} configuration exported by `harness export` from {source}."]
    if lost:
        lines.append("# not_expressed (the plan's settings this file cannot hold):")
        lines += [f"#   - {n.line()}" for n in lost]
    return "\n".join(lines) + "\n"


def optimizer_name(facts: Facts) -> str:
    """"adamw", or the strategy that replaces it (lamb, lars, muon)."""
    from training_harness.core.target import OPTIMIZERS

    return next((o for o in OPTIMIZERS if o in facts.strategies), "adamw")


def triton_kernels(fused: dict[str, Any]) -> list[str]:
    """The fused strategy's kernels the plan runs as the harness's Triton ones."""
    return [k for k in ("layernorm", "gelu", "cross_entropy") if fused[k] != "eager"]


def powersgd(ddp: dict[str, Any]) -> str:
    """The ddp strategy's PowerSGD compression as a not_expressed setting."""
    return (f"ddp.compression = powersgd (rank {ddp['powersgd_rank']}, after "
            f"{ddp['start_powersgd_iter']} steps)")


# the fused strategy's attention, as from_pretrained's attn_implementation names it
ATTN_IMPL = {"sdpa": "sdpa", "flex": "flex_attention"}


def adam_impl(facts: Facts) -> str:
    """AdamW's implementation as the plan ran it: "fused", "foreach", "triton" or
    "default" (the for-loop on a CPU)."""
    fused = facts.get("fused")
    return fused["optimizer"] if fused else "default"
