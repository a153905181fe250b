"""Muon for the hidden matrices, AdamW for the rest, as a strategy.

As the modded-nanogpt speedrun does: torch.optim.Muon (momentum, then the update
orthogonalised by a Newton-Schulz iteration) steps the 2-D weights inside the
model's repeated blocks (training_harness.workloads.blocks: attention and MLP matrices);
AdamW steps everything else (embeddings, the head, norm gains, biases, and
convolution filters, which torch's Muon does not take). `MuonWithAdamW` is the one
optimizer the step sees: its param_groups are the two optimizers' groups, so a
learning-rate schedule and the gradient scaler reach both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.core.plan import OptimizerSettings
from training_harness.strategies.base import Choice, Phase, Space, Strategy
from training_harness.strategies.lars import other_optimizers
from training_harness.strategies.registry import get, register
from training_harness.strategies.setup import Setup, adamw


class MuonWithAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over `muon_groups` and an AdamW over `adamw_groups`, stepped
    together. `state_dict` holds both; `param_groups` is Muon's groups, then AdamW's
    (the same dicts, so changing an lr here changes it there)."""

    def __init__(self, muon_groups: list[dict[str, Any]], adamw_groups: list[dict[str, Any]],
                 muon_kwargs: dict[str, Any],
                 make_adamw: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]) -> None:
        self.muon = torch.optim.Muon(muon_groups, **muon_kwargs)
        self.adamw = make_adamw(adamw_groups) if adamw_groups else None
        self.parts = [o for o in (self.muon, self.adamw) if o is not None]
        super().__init__([g for o in self.parts for g in o.param_groups], {})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.parts:
            optimizer.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(),
                "adamw": self.adamw.state_dict() if self.adamw is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state_dict["adamw"])


def groups_of(params: Iterable[Any]) -> list[dict[str, Any]]:
    """The parameters as group dicts (one group when given plain tensors)."""
    items = list(params)
    if items and isinstance(items[0], dict):
        return [dict(g, params=list(g["params"])) for g in items]
    return [{"params": items}]


def split(params: Iterable[Any], rule: Callable[[torch.Tensor], bool]
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(groups of the parameters the rule picks, groups of the others); each group keeps
    its own keys, and empty groups are left out."""
    chosen, rest = [], []
    for group in groups_of(params):
        picked = [p for p in group["params"] if rule(p)]
        others = [p for p in group["params"] if not rule(p)]
        if picked:
            chosen.append(dict(group, params=picked))
        if others:
            rest.append(dict(group, params=others))
    return chosen, rest


def hidden_matrices(model: torch.nn.Module) -> set[int]:
    """ids of the 2-D parameters inside the model's repeated blocks (wrappers seen
    through); a parameter shared with something outside them (a tied embedding) counts
    as outside."""
    from training_harness.workloads.blocks import find_blocks

    blocks = find_blocks(model)
    if blocks is None:
        return set()
    inside = {id(p) for block in blocks for p in block.parameters() if p.ndim == 2}
    prefixes = tuple(blocks.prefixes())  # wrappers sit below these names
    outside = {id(p) for name, p in model.named_parameters(remove_duplicate=False)
               if not name.startswith(prefixes)}
    return inside - outside


@dataclass
class MuonSettings:
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = bounded(5, 1, 99)  # Newton-Schulz iterations
    # How Muon's lr is scaled per matrix (torch.optim.Muon's adjust_lr_fn):
    # "match_rms_adamw" (0.2 sqrt(max(rows, cols)), Moonshot's: the update's RMS is
    # AdamW's, so the plan's lr and weight decay serve both halves) or "original"
    # (sqrt(max(1, rows/cols)), Keller Jordan's: give lr_ratio ~ 20-50).
    adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    lr_ratio: float = 1.0  # Muon's lr = the plan's lr x lr_ratio; AdamW's is the plan's

    def validate(self, where: str) -> None:
        if not 0 <= self.momentum < 1:
            raise HarnessError(f"{where}.momentum: must be in [0, 1)")
        if not 0 < self.lr_ratio <= 1e4:
            raise HarnessError(f"{where}.lr_ratio: must be above 0 (at most 1e4)")


class MuonStrategy(Strategy):
    name = "muon"
    summary = "Muon (torch.optim.Muon) for the blocks' 2-D weights, AdamW for the rest"
    phases = (Phase.OPTIMIZER,)
    Settings = MuonSettings
    requires = "torch.optim.Muon (torch 2.9+)"

    def space(self) -> dict[str, Space]:
        return {"momentum": Choice((0.9, 0.95))}

    def check(self, settings: MuonSettings, plan: Any, env: Any) -> list[str]:
        reasons = other_optimizers(self.name, plan)
        if not hasattr(torch.optim, "Muon"):
            reasons.append(f"muon: torch {torch.__version__} has no torch.optim.Muon "
                           "(added in torch 2.9); upgrade torch or use adamw")
        zero = plan.strategies.get("zero")
        stage = get("zero").parse(zero).stage if zero is not None else 0
        if stage >= 2:
            reasons.append("muon: orthogonalises each whole weight matrix, and zero stage "
                           f"{stage} (FSDP2) gives the optimizer a shard of "
                           "rows; use ddp")
        elif stage == 1:
            reasons.append("muon: splits each parameter group in two (Muon's and AdamW's), "
                           "and zero stage 1's ZeroRedundancyOptimizer syncs its own groups "
                           "into the local optimizer's one to one; use ddp")
        if "tensor" in plan.strategies and plan.layout.tensor > 1:
            reasons.append("muon: orthogonalises each whole weight matrix, and tensor "
                           "parallel gives the optimizer a column or row slice (DTensor); "
                           "use data or pipeline parallelism")
        return reasons

    def apply(self, phase: Phase, setup: Setup, settings: MuonSettings) -> None:
        def muon(params: Iterable[Any], hp: OptimizerSettings,
                 impl: str = "default") -> MuonWithAdamW:
            hidden = hidden_matrices(setup.model)
            matrices, rest = split(params, lambda p: id(p) in hidden)
            if not matrices:
                raise HarnessError(
                    "muon: the model has no 2-D weights inside repeated blocks "
                    "(training_harness.workloads.blocks) for Muon to step; everything would be "
                    "AdamW's: use adamw")
            kwargs = dict(lr=hp.lr * settings.lr_ratio, weight_decay=hp.weight_decay,
                          momentum=settings.momentum, nesterov=settings.nesterov,
                          ns_steps=settings.ns_steps, adjust_lr_fn=settings.adjust_lr)
            # The AdamW half in the plan's implementation (fused, foreach, triton ...).
            return MuonWithAdamW(matrices, rest, kwargs, lambda groups: adamw(groups, hp, impl))

        setup.optimizer_factory = muon


register(MuonStrategy())
