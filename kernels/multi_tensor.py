"""Multi-tensor AdamW and LAMB steps: every tensor of a list updated by a fixed number of
Triton launches (AdamW one, LAMB three), whatever the number of tensors.

How one launch covers many tensors: a table of pointers. For each tensor i the
table holds the addresses of its parameter, gradient and two moment buffers and
its size; each tensor is cut into BLOCK-element blocks, and a second table maps
each block (one program) to its tensor. A program loads its tensor's addresses,
casts them to pointers of the right dtype and updates its block in place, in
fp32. Nothing is copied or concatenated; the tables are cached by their content
(addresses and sizes), so a training loop re-sends them only when the
gradients are re-allocated at new addresses. Tensors must be contiguous; the
lists are split into groups of one device and one dtype per kind of buffer,
one launch set per group.

LAMB needs a norm per tensor before it can update: launch 1 updates the moments
and writes per block the partial sums of w^2 and u^2 (u the Adam direction with
weight decay); launch 2 sums each tensor's partials (one program per tensor, in
a fixed order: deterministic) and makes the trust ratio; launch 3 recomputes u
from the stored moments and applies w <- w - lr * ratio * u.

The formulas are the references below: `adamw_step_reference` is torch.optim.AdamW
(decoupled weight decay), `lamb_step_reference` is strategies.lamb.Lamb's update.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

from training_harness.kernels.dispatch import jit, resolve

tl = None  # triton.language, bound by dispatch.jit at the first launch (kernels/dispatch.py)

BLOCK = 1024
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@jit
def _moments_kernel(Table, BlockTensor, T, P0, G0, M0, GradScale, Partials, lr, beta1, beta2,
                    eps, weight_decay, bc1, bc2_sqrt, HAS_SCALE: tl.constexpr,
                    LAMB: tl.constexpr, BLOCK: tl.constexpr):
    """m, v <- their updates; then AdamW's w <- its update, or LAMB's launch 1:
    Partials[block] = (sum w^2, sum u^2) over the block."""
    pid = tl.program_id(0)
    t = tl.load(BlockTensor + pid)
    p_ptr = tl.load(Table + t).to(tl.pointer_type(P0.dtype.element_ty))
    g_ptr = tl.load(Table + T + t).to(tl.pointer_type(G0.dtype.element_ty))
    m_ptr = tl.load(Table + 2 * T + t).to(tl.pointer_type(M0.dtype.element_ty))
    v_ptr = tl.load(Table + 3 * T + t).to(tl.pointer_type(M0.dtype.element_ty))
    offs = (pid - tl.load(Table + 5 * T + t)) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < tl.load(Table + 4 * T + t)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        g = g * tl.load(GradScale).to(tl.float32)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    tl.store(m_ptr + offs, m.to(M0.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(M0.dtype.element_ty), mask=mask)
    if LAMB:
        # u from the moments as stored, so that launch 3 recomputes the same u
        m = m.to(M0.dtype.element_ty).to(tl.float32)
        v = v.to(M0.dtype.element_ty).to(tl.float32)
        u = tl.where(mask, (m / bc1) / (tl.sqrt(v) / bc2_sqrt + eps) + weight_decay * p, 0.0)
        tl.store(Partials + 2 * pid, tl.sum(p * p, axis=0))
        tl.store(Partials + 2 * pid + 1, tl.sum(u * u, axis=0))
    else:
        p = p * (1.0 - lr * weight_decay)
        p = p - (lr / bc1) * (m / (tl.sqrt(v) / bc2_sqrt + eps))
        tl.store(p_ptr + offs, p.to(P0.dtype.element_ty), mask=mask)


@jit
def _lamb_ratio_kernel(Table, T, Partials, Ratio, BLOCK_R: tl.constexpr):
    """Ratio[t] = ||w|| / ||u|| for tensor t (1 when either is 0), from its blocks' partials."""
    t = tl.program_id(0)
    first = tl.load(Table + 5 * T + t)
    n_blocks = tl.load(Table + 6 * T + t)
    w2 = tl.zeros((BLOCK_R,), dtype=tl.float32)
    u2 = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, n_blocks, BLOCK_R):
        idx = start + tl.arange(0, BLOCK_R)
        ok = idx < n_blocks
        w2 += tl.load(Partials + 2 * (first + idx), mask=ok, other=0.0)
        u2 += tl.load(Partials + 2 * (first + idx) + 1, mask=ok, other=0.0)
    w_norm = tl.sqrt(tl.sum(w2, axis=0))
    u_norm = tl.sqrt(tl.sum(u2, axis=0))
    ok = (w_norm > 0.0) & (u_norm > 0.0)
    tl.store(Ratio + t, tl.where(ok, w_norm / tl.where(ok, u_norm, 1.0), 1.0))


@jit
def _lamb_apply_kernel(Table, BlockTensor, T, P0, M0, Ratio, lr, eps, weight_decay, bc1,
                       bc2_sqrt, BLOCK: tl.constexpr):
    """w <- w - lr * (ratio[t] * u), u recomputed from the moments of launch 1."""
    pid = tl.program_id(0)
    t = tl.load(BlockTensor + pid)
    p_ptr = tl.load(Table + t).to(tl.pointer_type(P0.dtype.element_ty))
    m_ptr = tl.load(Table + 2 * T + t).to(tl.pointer_type(M0.dtype.element_ty))
    v_ptr = tl.load(Table + 3 * T + t).to(tl.pointer_type(M0.dtype.element_ty))
    offs = (pid - tl.load(Table + 5 * T + t)) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < tl.load(Table + 4 * T + t)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = (m / bc1) / (tl.sqrt(v) / bc2_sqrt + eps) + weight_decay * p
    p = p - lr * (u * tl.load(Ratio + t))
    tl.store(p_ptr + offs, p.to(P0.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=32)
def _tables(device: torch.device, ptrs: tuple, numels: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(Table, BlockTensor) on `device`. Table rows (T each): param, grad, exp_avg,
    exp_avg_sq addresses, numel, first block, block count; BlockTensor: block -> tensor."""
    n = torch.tensor(numels, dtype=torch.int64)
    n_blocks = (n + BLOCK - 1) // BLOCK
    first = torch.cumsum(n_blocks, 0) - n_blocks
    block_tensor = torch.repeat_interleave(torch.arange(len(numels)), n_blocks)
    addresses = torch.tensor(ptrs, dtype=torch.int64).reshape(-1)
    flat = torch.cat([addresses, n, first, n_blocks, block_tensor]).to(device)
    return flat[: 7 * len(numels)], flat[7 * len(numels):]


def _groups(params, grads, exp_avgs, exp_avg_sqs):
    """Index lists of the tensors sharing a device and the dtypes of each kind of buffer."""
    if not len(params) == len(grads) == len(exp_avgs) == len(exp_avg_sqs):
        raise ValueError("params, grads, exp_avgs and exp_avg_sqs must have the same length")
    groups = defaultdict(list)
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)):
        if not p.numel() == g.numel() == m.numel() == v.numel():
            raise ValueError(f"tensor {i}: param, grad and state sizes differ")
        if m.dtype != v.dtype:
            raise ValueError(f"tensor {i}: exp_avg and exp_avg_sq dtypes differ")
        groups[(p.device, p.dtype, g.dtype, m.dtype)].append(i)
    return list(groups.values())


def _launch_args(idx, params, grads, exp_avgs, exp_avg_sqs):
    lists = (params, grads, exp_avgs, exp_avg_sqs)
    ptrs = tuple(tuple(lst[i].data_ptr() for i in idx) for lst in lists)
    numels = tuple(params[i].numel() for i in idx)
    table, block_tensor = _tables(params[idx[0]].device, ptrs, numels)
    return table, block_tensor, len(idx), params[idx[0]], grads[idx[0]], exp_avgs[idx[0]]


def _supported(*lists) -> bool:
    return all(t.dtype in DTYPES and t.is_contiguous() for lst in lists for t in lst)


def _scale_arg(grad_scale, like):
    if grad_scale is None:
        return like, False
    return torch.as_tensor(grad_scale, dtype=torch.float32, device=like.device).reshape(1), True


def adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
               grad_scale=None, impl="auto"):
    """One torch.optim.AdamW step (no amsgrad) on every tensor, in place, at step `step`
    (1 for the first) for all of them. grad_scale (a float or a 1-element tensor, e.g. a
    clipping coefficient) multiplies the gradients as they are read."""
    if not params:
        return
    all_ = (params, grads, exp_avgs, exp_avg_sqs)
    if not resolve(impl, params[0], _supported(*all_)):
        return adamw_step_reference(*all_, step, lr, beta1, beta2, eps, weight_decay, grad_scale)
    bc1, bc2_sqrt = 1 - beta1**step, math.sqrt(1 - beta2**step)
    for idx in _groups(*all_):
        table, block_tensor, t, p0, g0, m0 = _launch_args(idx, *all_)
        scale, has_scale = _scale_arg(grad_scale, p0)
        if not block_tensor.numel():
            continue  # only empty tensors
        _moments_kernel[(block_tensor.numel(),)](
            table, block_tensor, t, p0, g0, m0, scale, table, float(lr), float(beta1),
            float(beta2), float(eps), float(weight_decay), float(bc1), float(bc2_sqrt),
            HAS_SCALE=has_scale, LAMB=False, BLOCK=BLOCK,
        )


def lamb_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
              grad_scale=None, impl="auto"):
    """One LAMB step (strategies.lamb.Lamb's update) on every tensor, in place; arguments
    as in `adamw_step`. Three launches per group of tensors."""
    if not params:
        return
    all_ = (params, grads, exp_avgs, exp_avg_sqs)
    if not resolve(impl, params[0], _supported(*all_)):
        return lamb_step_reference(*all_, step, lr, beta1, beta2, eps, weight_decay, grad_scale)
    bc1, bc2_sqrt = float(1 - beta1**step), float(math.sqrt(1 - beta2**step))
    lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
    for idx in _groups(*all_):
        table, block_tensor, t, p0, g0, m0 = _launch_args(idx, *all_)
        scale, has_scale = _scale_arg(grad_scale, p0)
        n_blocks = block_tensor.numel()
        partials = torch.empty(2 * n_blocks, dtype=torch.float32, device=p0.device)
        ratio = torch.empty(t, dtype=torch.float32, device=p0.device)
        if n_blocks:
            _moments_kernel[(n_blocks,)](
                table, block_tensor, t, p0, g0, m0, scale, partials, lr, float(beta1),
                float(beta2), eps, weight_decay, bc1, bc2_sqrt, HAS_SCALE=has_scale, LAMB=True,
                BLOCK=BLOCK,
            )
        _lamb_ratio_kernel[(t,)](table, t, partials, ratio, BLOCK_R=256)
        if n_blocks:
            _lamb_apply_kernel[(n_blocks,)](
                table, block_tensor, t, p0, m0, ratio, lr, eps, weight_decay, bc1, bc2_sqrt,
                BLOCK=BLOCK,
            )


def _scaled_grads(grads, grad_scale):
    if grad_scale is None:
        return grads
    return [g * torch.as_tensor(grad_scale, device=g.device).to(g.dtype) for g in grads]


@torch.no_grad()
def adamw_step_reference(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,
                         weight_decay, grad_scale=None):
    """torch.optim.AdamW's single-tensor update, tensor by tensor."""
    bc1, bc2_sqrt = 1 - beta1**step, math.sqrt(1 - beta2**step)
    for p, g, m, v in zip(params, _scaled_grads(grads, grad_scale), exp_avgs, exp_avg_sqs,
                          strict=True):
        p.mul_(1 - lr * weight_decay)
        m.lerp_(g.to(m.dtype), 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(eps), value=-lr / bc1)


@torch.no_grad()
def lamb_step_reference(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps,
                        weight_decay, grad_scale=None):
    """LAMB as strategies.lamb.Lamb (bias-corrected moments, trust ratio per tensor)."""
    bc1, bc2_sqrt = 1 - beta1**step, math.sqrt(1 - beta2**step)
    for p, g, m, v in zip(params, _scaled_grads(grads, grad_scale), exp_avgs, exp_avg_sqs,
                          strict=True):
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        u = (m / bc1).div_(v.sqrt().div_(bc2_sqrt).add_(eps)).add_(p, alpha=weight_decay)
        w_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(u)
        ok = (w_norm > 0) & (u_norm > 0)
        ratio = torch.where(ok, w_norm / torch.where(ok, u_norm, 1.0), 1.0)
        p.sub_(u.mul_(ratio), alpha=lr)


class MultiTensorAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (no amsgrad) stepping each group with `adamw_step`: one launch per
    group of same-step, same-device, same-dtype tensors. The state ("step" a float CPU
    tensor, "exp_avg", "exp_avg_sq") is torch.optim.AdamW's, so state dicts move between
    the two."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 impl="auto"):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, impl=impl))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            by_step = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("MultiTensorAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                by_step[int(state["step"].item())].append(p)
            (beta1, beta2) = group["betas"]
            for step, ps in by_step.items():
                states = [self.state[p] for p in ps]
                adamw_step([_local(p) for p in ps], [_local(p.grad) for p in ps],
                           [_local(s["exp_avg"]) for s in states],
                           [_local(s["exp_avg_sq"]) for s in states], step, group["lr"], beta1,
                           beta2, group["eps"], group["weight_decay"],
                           impl=group.get("impl", "auto"))
        return loss


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter, gradient or moment as this rank's shard, which
    shares its storage: a DTensor's own data_ptr() is 0, so the kernel's address table
    needs the shard's. AdamW is element-wise, so stepping each shard is the whole step."""
    return t.to_local() if isinstance(t, DTensor) else t
