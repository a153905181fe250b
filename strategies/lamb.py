"""LAMB: Adam's update scaled per tensor by a layer-wise trust ratio, as a strategy.

`Lamb` is the optimizer; `LambStrategy` ("lamb") makes it the plan's optimizer
in place of AdamW, with the plan's lr, betas, eps and weight decay.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from training_harness.core.errors import HarnessError
from training_harness.core.plan import OptimizerSettings
from training_harness.strategies.base import Choice, Phase, Space, Strategy
from training_harness.strategies.lars import groups_with_grads
from training_harness.strategies.registry import register
from training_harness.strategies.setup import Setup


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning").

    At step t, for each parameter tensor w with gradient g:

        g   <- g * min(1, max_grad_norm / ||all g||)     (only if max_grad_norm is set)
        m   <- b1*m + (1-b1)*g
        v   <- b2*v + (1-b2)*g^2
        m^  =  m / (1 - b1^t),   v^ = v / (1 - b2^t)
        u   =  m^ / (sqrt(v^) + eps) + weight_decay*w
        r   =  ||w|| / ||u||     (r = 1 when either norm is 0)
        w   <- w - lr*r*u

    The clipping norm is over every gradient in every group and clips a copy: the
    `.grad` tensors are left as they are. The trust ratio applies to every tensor,
    biases and norm weights included. State (`step`, an int; `exp_avg`,
    `exp_avg_sq`) has the parameter's dtype, as in torch's AdamW. `foreach=True`
    runs the same update with torch._foreach_* ops per device and dtype;
    `foreach=None` picks it when every parameter of a group is on CUDA.
    `fused=True` runs it as Triton multi-tensor kernels (kernels.multi_tensor.lamb_step:
    three launches per group of same-step tensors); it needs CUDA or TRITON_INTERPRET=1.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = None,
        foreach: bool | None = None,
        fused: bool = False,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr: must be 0 or more, got {lr}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas: must be two numbers in [0, 1), got {betas}")
        if not eps > 0.0:
            raise ValueError(f"eps: must be above 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay: must be 0 or more, got {weight_decay}")
        if max_grad_norm is not None and not max_grad_norm >= 0.0:
            raise ValueError(f"max_grad_norm: must be None or 0 (off) or more, got {max_grad_norm}")
        self.max_grad_norm = max_grad_norm or None
        self.fused = fused
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=foreach
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(group, params, [p.grad for p in params], foreach)
                for group, params, foreach in groups_with_grads(self, "Lamb")]
        if not work:
            return loss
        if self.max_grad_norm is not None:
            coef = self._clip_coef([g for w in work for g in w[2]], any(w[3] for w in work))
            work = [(gr, ps, _scaled(gs, coef, fe), fe) for gr, ps, gs, fe in work]
        for group, params, grads, foreach in work:
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            if self.fused:
                self._update_triton(group, params, grads)
            else:
                (self._update_foreach if foreach else self._update_loop)(group, params, grads)
        return loss

    def _clip_coef(self, grads: list[torch.Tensor], foreach: bool) -> torch.Tensor:
        """min(1, max_grad_norm / total norm), a tensor on the first gradient's device."""
        if foreach:
            norms = torch._foreach_norm(grads)
        else:
            norms = [torch.linalg.vector_norm(g) for g in grads]
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        total = torch.linalg.vector_norm(torch.stack([n.to(grads[0].device, dtype) for n in norms]))
        return self.max_grad_norm / total.clamp(min=self.max_grad_norm)

    def _update_loop(self, group: dict, params: list, grads: list) -> None:
        (beta1, beta2), eps = group["betas"], group["eps"]
        wd, lr = group["weight_decay"], group["lr"]
        for p, g in zip(params, grads, strict=True):
            state = self.state[p]
            m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = v.sqrt().div_(math.sqrt(1 - beta2**t)).add_(eps)
            u = m.div(1 - beta1**t).div_(denom)
            if wd != 0:
                u.add_(p, alpha=wd)
            w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
            p.add_(u.mul_(_trust_ratio(w_norm, u_norm)), alpha=-lr)

    def _update_foreach(self, group: dict, params: list, grads: list) -> None:
        (beta1, beta2), eps = group["betas"], group["eps"]
        wd, lr = group["weight_decay"], group["lr"]
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, p in enumerate(params):
            buckets[(p.device, p.dtype)].append(i)
        for idx in buckets.values():
            ps, gs = [params[i] for i in idx], [grads[i] for i in idx]
            states = [self.state[p] for p in ps]
            ms, vs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
            steps = [s["step"] for s in states]
            torch._foreach_mul_(ms, beta1)
            torch._foreach_add_(ms, gs, alpha=1 - beta1)
            torch._foreach_mul_(vs, beta2)
            torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, [math.sqrt(1 - beta2**t) for t in steps])
            torch._foreach_add_(denom, eps)
            us = torch._foreach_div(ms, [1 - beta1**t for t in steps])
            torch._foreach_div_(us, denom)
            if wd != 0:
                torch._foreach_add_(us, ps, alpha=wd)
            w_norm = torch.stack(torch._foreach_norm(ps))
            u_norm = torch.stack(torch._foreach_norm(us))
            torch._foreach_mul_(us, list(_trust_ratio(w_norm, u_norm).unbind(0)))
            torch._foreach_add_(ps, us, alpha=-lr)


    def _update_triton(self, group: dict, params: list, grads: list) -> None:
        from training_harness.kernels.multi_tensor import lamb_step

        (beta1, beta2), eps = group["betas"], group["eps"]
        by_step: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(params):
            by_step[self.state[p]["step"]].append(i)
        for t, idx in by_step.items():
            states = [self.state[params[i]] for i in idx]
            lamb_step(
                [params[i] for i in idx], [grads[i] for i in idx],
                [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                t, group["lr"], beta1, beta2, eps, group["weight_decay"], impl="triton",
            )


def _trust_ratio(w_norm: torch.Tensor, u_norm: torch.Tensor) -> torch.Tensor:
    """||w|| / ||u||, or 1 where either norm is 0 (no host sync)."""
    return torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))


def _scaled(grads: list[torch.Tensor], coef: torch.Tensor, foreach: bool) -> list[torch.Tensor]:
    """The gradients times the clipping coefficient (new tensors, `.grad` untouched)."""
    coefs = {(g.device, g.dtype): coef.to(g.device, g.dtype) for g in grads}
    if foreach and len(coefs) == 1:
        return torch._foreach_mul(grads, next(iter(coefs.values())))
    return [g * coefs[(g.device, g.dtype)] for g in grads]


@dataclass
class LambSettings:
    max_grad_norm: float = 0.0  # global gradient-norm clipping; 0 = off

    def validate(self, where: str) -> None:
        if not self.max_grad_norm >= 0:
            raise HarnessError(f"{where}.max_grad_norm: must be 0 (off) or more")


class LambStrategy(Strategy):
    name = "lamb"
    summary = "LAMB optimizer (layer-wise trust ratio) instead of AdamW"
    phases = (Phase.OPTIMIZER,)
    Settings = LambSettings
    requires = "nothing"

    def space(self) -> dict[str, Space]:
        return {"max_grad_norm": Choice((0.0, 1.0))}

    def apply(self, phase: Phase, setup: Setup, settings: LambSettings) -> None:
        max_grad_norm = settings.max_grad_norm or None

        def lamb(params: Iterable[Any], hp: OptimizerSettings, impl: str = "default") -> Lamb:
            if impl not in ("default", "foreach", "fused", "triton"):
                raise ValueError(f"impl: expected default, foreach, fused or triton, got {impl!r}")
            # torch has no fused LAMB: "fused" is the foreach path, "triton" our kernels.
            return Lamb(
                params, lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps, weight_decay=hp.weight_decay,
                max_grad_norm=max_grad_norm, foreach=impl in ("foreach", "fused"),
                fused=impl == "triton",
            )

        setup.optimizer_factory = lamb


register(LambStrategy())
