"""LARS: momentum SGD with a layer-wise trust ratio, as a strategy.

`Lars` is the optimizer; `LarsStrategy` ("lars") makes it the plan's optimizer in
place of AdamW, with the plan's lr and weight decay (its betas and eps are AdamW's and
are not used). Biases and norm gains (tensors of one dimension) are left out of the
trust ratio and the weight decay, as the LARS recipes for ResNet-50 and BERT do. That
rule is per tensor inside the optimizer, not a parameter group of its own, so the groups
stay the ones it was given (ZeRO-1's ZeroRedundancyOptimizer syncs its groups' settings
into the local optimizer's, group by group).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from training_harness.core.config import bounded
from training_harness.core.errors import HarnessError
from training_harness.core.plan import OptimizerSettings
from training_harness.strategies.base import Choice, Phase, Space, Strategy
from training_harness.strategies.registry import register
from training_harness.strategies.setup import Setup


class Lars(torch.optim.Optimizer):
    """LARS (You, Gitman and Ginsburg, 2017, "Large Batch Training of Convolutional
    Networks"), in the form of timm's and NVIDIA's implementations.

    At each step, for each parameter tensor w with gradient g:

        r   =  eta * ||w|| / (||g|| + weight_decay*||w|| + eps)   (r = 1 when either norm is 0)
        d   =  r * (g + weight_decay*w)

    except, with `exclude_vectors` (the default), for tensors of one dimension or none
    (biases and norm gains): d = g, no trust ratio and no weight decay. Then, with
    momentum mu,

        b   <- d at the first step, else mu*b + d      (torch SGD's buffer, no dampening)
        w   <- w - lr*b                                (w - lr*d when mu = 0)

    State: `momentum_buffer` (the parameter's dtype) where mu > 0, nothing else.
    `foreach=True` runs the same update with torch._foreach_* ops per device and
    dtype; `foreach=None` picks it when every parameter of a group is on CUDA.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 1e-3,
        eps: float = 1e-8,
        exclude_vectors: bool = True,
        foreach: bool | None = None,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr: must be 0 or more, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum: must be in [0, 1), got {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay: must be 0 or more, got {weight_decay}")
        if not trust_coefficient > 0.0:
            raise ValueError(f"trust_coefficient: must be above 0, got {trust_coefficient}")
        if not eps >= 0.0:
            raise ValueError(f"eps: must be 0 or more, got {eps}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps,
                        exclude_vectors=exclude_vectors, foreach=foreach)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, params, foreach in groups_with_grads(self, "Lars"):
            (self._update_foreach if foreach else self._update_loop)(group, params)
        return loss

    def _update_loop(self, group: dict, params: list) -> None:
        wd, lr, mu = group["weight_decay"], group["lr"], group["momentum"]
        for p in params:
            g = p.grad
            if group["exclude_vectors"] and p.ndim <= 1:
                d = g.clone()
            else:
                d = g.add(p, alpha=wd) if wd != 0 else g.clone()
                w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                d.mul_(_trust_ratio(w_norm, g_norm, wd, group["trust_coefficient"],
                                    group["eps"]))
            if mu != 0:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = d
                else:
                    d = state["momentum_buffer"].mul_(mu).add_(d)
            p.add_(d, alpha=-lr)

    def _update_foreach(self, group: dict, params: list) -> None:
        wd, lr, mu = group["weight_decay"], group["lr"], group["momentum"]
        buckets: dict[tuple, list[Any]] = defaultdict(list)
        for p in params:  # adapted tensors, and vectors left out, apart
            left_out = group["exclude_vectors"] and p.ndim <= 1
            buckets[(p.device, p.dtype, left_out)].append(p)
        for (_, _, left_out), ps in buckets.items():
            gs = [p.grad for p in ps]
            if left_out:
                ds = [g.clone() for g in gs]
            else:
                ds = (torch._foreach_add(gs, ps, alpha=wd) if wd != 0
                      else [g.clone() for g in gs])
                w_norm = torch.stack(torch._foreach_norm(ps))
                g_norm = torch.stack(torch._foreach_norm(gs))
                ratio = _trust_ratio(w_norm, g_norm, wd, group["trust_coefficient"],
                                     group["eps"])
                torch._foreach_mul_(ds, list(ratio.unbind(0)))
            if mu != 0:
                states = [self.state[p] for p in ps]
                old = [i for i, s in enumerate(states) if "momentum_buffer" in s]
                for i, s in enumerate(states):
                    if "momentum_buffer" not in s:
                        s["momentum_buffer"] = ds[i]
                if old:
                    bufs = [states[i]["momentum_buffer"] for i in old]
                    torch._foreach_mul_(bufs, mu)
                    torch._foreach_add_(bufs, [ds[i] for i in old])
                ds = [s["momentum_buffer"] for s in states]
            torch._foreach_add_(ps, ds, alpha=-lr)


def groups_with_grads(optimizer: torch.optim.Optimizer, name: str
                      ) -> Iterator[tuple[dict, list, bool]]:
    """(group, its parameters with a gradient, whether to run foreach) for each group that
    has any; `foreach=None` picks foreach when every one of them is on CUDA."""
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError(f"{name} does not support sparse gradients; use dense ones")
        foreach = group["foreach"]
        yield group, params, all(p.is_cuda for p in params) if foreach is None else foreach


def _trust_ratio(w_norm: torch.Tensor, g_norm: torch.Tensor, wd: float, eta: float,
                 eps: float) -> torch.Tensor:
    """eta ||w|| / (||g|| + wd ||w|| + eps), or 1 where either norm is 0 (no host sync)."""
    ratio = eta * w_norm / (g_norm + wd * w_norm + eps)
    return torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(w_norm))


@dataclass
class LarsSettings:
    momentum: float = 0.9
    # eta: each adapted tensor moves by lr x eta x ||w|| per step (before momentum), so
    # LARS's lr is about 1 where AdamW's is 1e-3: give it its own [target] lr list.
    trust_coefficient: float = 1e-3
    eps: float = bounded(1e-8, 0.0, 1.0)

    def validate(self, where: str) -> None:
        if not 0 <= self.momentum < 1:
            raise HarnessError(f"{where}.momentum: must be in [0, 1)")
        if not 0 < self.trust_coefficient <= 1:
            raise HarnessError(f"{where}.trust_coefficient: must be above 0 and at most 1")


def other_optimizers(name: str, plan: Any) -> list[str]:
    """A refusal when the plan names a second optimizer strategy beside `name`."""
    from training_harness.core.target import OPTIMIZERS

    others = [o for o in OPTIMIZERS if o != name and o in plan.strategies]
    if not others:
        return []
    return [f"{name}: replaces AdamW as the optimizer, and so does {' and '.join(others)}; "
            f"a plan has one optimizer: keep one of {', '.join([name, *others])}"]


class LarsStrategy(Strategy):
    name = "lars"
    summary = "LARS optimizer (momentum SGD, layer-wise trust ratio) instead of AdamW"
    phases = (Phase.OPTIMIZER,)
    Settings = LarsSettings
    requires = "nothing"

    def space(self) -> dict[str, Space]:
        return {"momentum": Choice((0.9, 0.95))}

    def check(self, settings: LarsSettings, plan: Any, env: Any) -> list[str]:
        reasons = other_optimizers(self.name, plan)
        fused = plan.strategies.get("fused") or {}
        if fused.get("optimizer") == "triton":
            reasons.append("lars: fused optimizer = 'triton' has no LARS kernel (its Triton "
                           "multi-tensor step is AdamW's and LAMB's); use optimizer = "
                           "'foreach' or 'default'")
        return reasons

    def apply(self, phase: Phase, setup: Setup, settings: LarsSettings) -> None:
        def lars(params: Iterable[Any], hp: OptimizerSettings, impl: str = "default") -> Lars:
            if impl not in ("default", "foreach", "fused"):
                raise ValueError(f"impl: expected default, foreach or fused, got {impl!r}")
            # torch has no fused LARS: "fused" is the foreach path.
            return Lars(params, lr=hp.lr, momentum=settings.momentum,
                        weight_decay=hp.weight_decay,
                        trust_coefficient=settings.trust_coefficient, eps=settings.eps,
                        foreach=impl in ("foreach", "fused"))

        setup.optimizer_factory = lars


register(LarsStrategy())
