"""Benchmarks of kernels/ (not tests): each kernel against eager PyTorch and torch.compile.

Skipped by default (pyproject: --benchmark-skip). Run them with

    pytest tests/benchmarks/test_kernels_bench.py --benchmark-only
    pytest ... --benchmark-only --benchmark-group-by=group --benchmark-columns=min,mean

One group per kernel ("kernels:layernorm", ...), one entry per implementation:
"eager" (the plain-PyTorch reference, what an unfused model runs), "compile"
(torch.compile of that reference) and, on a GPU, "triton" (the kernel). The Triton
kernels are not timed on the CPU: there they run in Triton's interpreter, which is
a correctness tool, thousands of times slower. Sizes are training-like on a GPU and
smaller on the CPU.

Each entry records in extra_info the minimum bytes the operation must move
(`bytes`: every input read once, every output written once; for training kernels,
forward plus backward), the achieved rate at the fastest round (`gbps` = bytes /
min time), the device's copy bandwidth measured here (`copy_gbps`: a large
tensor's copy_, the practical memory-bandwidth ceiling) and `of_floor` = time
floor (bytes / copy bandwidth) / min time: 1.0 would be as fast as memory allows.
"""

from __future__ import annotations

import functools

import pytest
import torch

from training_harness.kernels import bias_gelu, cross_entropy, layernorm, multi_tensor

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32  # activations; optimizer state is fp32
IMPLS = ["eager", "compile", "triton"]
ROWS = 8192 if CUDA else 2048  # tokens


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


@functools.cache
def copy_gbps() -> float:
    """Bytes read + written per second by a large device copy (best of 10)."""
    n = (256 if CUDA else 32) * 2**20 // 4
    src, dst = torch.randn(n, device=DEVICE), torch.empty(n, device=DEVICE)
    best = float("inf")
    for _ in range(10):
        if CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            import time

            t = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best / 1e9


def _select(impl: str, reference, triton_fn):
    """The callable for `impl`; skips what cannot run here."""
    if impl == "eager":
        return reference
    if impl == "compile":
        return torch.compile(reference)
    if not CUDA:
        pytest.skip("the Triton kernels are timed on a GPU only (the CPU runs the interpreter)")
    return triton_fn


def _bench(benchmark, group: str, fn, nbytes: int) -> None:
    benchmark.group = f"kernels:{group}"
    try:
        fn()  # warm-up: compiles (torch.compile, Triton) outside the timing
    except Exception as e:  # e.g. no C++ compiler for inductor's CPU code
        pytest.skip(f"{type(e).__name__}: {e}")
    _sync()

    def timed():
        fn()
        _sync()

    benchmark(timed)
    info = benchmark.extra_info
    info.update(bytes=nbytes, device=DEVICE, dtype=str(DTYPE), copy_gbps=round(copy_gbps(), 1))
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        best = stats.stats.min
        info.update(gbps=round(nbytes / best / 1e9, 1),
                    of_floor=round(nbytes / (copy_gbps() * 1e9) / best, 3))


def _grads(fn, inputs, grad_out_like=None):
    """Forward + backward via autograd.grad (no .grad accumulation between rounds)."""

    def run():
        out = fn(*inputs)
        dy = torch.ones_like(out) if grad_out_like is None else grad_out_like
        torch.autograd.grad(out, [t for t in inputs if t.requires_grad], dy)

    return run


@pytest.mark.parametrize("impl", IMPLS)
def test_layernorm(benchmark, impl):
    n = 4096 if CUDA else 1024
    x = torch.randn(ROWS, n, device=DEVICE, dtype=DTYPE, requires_grad=True)
    w = torch.randn(n, device=DEVICE, dtype=DTYPE, requires_grad=True)
    b = torch.randn(n, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dy = torch.randn_like(x)
    fn = _select(impl, layernorm.layer_norm_reference,
                 lambda *a: layernorm.layer_norm(*a, impl="triton"))
    s = x.element_size()
    # fwd: read x, w, b, write y, mean, rstd; bwd: read x, dy, w, mean, rstd, write dx, dw, db
    nbytes = 5 * ROWS * n * s + 5 * n * s + 4 * ROWS * 4
    _bench(benchmark, "layernorm", _grads(fn, (x, w, b), dy), nbytes)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("impl", IMPLS)
def test_bias_gelu(benchmark, impl, approximate):
    n = 4 * 4096 if CUDA else 4096
    x = torch.randn(ROWS, n, device=DEVICE, dtype=DTYPE, requires_grad=True)
    b = torch.randn(n, device=DEVICE, dtype=DTYPE, requires_grad=True)
    dy = torch.randn_like(x)
    fn = _select(impl, functools.partial(bias_gelu.bias_gelu_reference, approximate=approximate),
                 lambda x, b: bias_gelu.bias_gelu(x, b, approximate, impl="triton"))
    # fwd: read x, b, write y; bwd: read x, b, dy, write dx, db
    nbytes = 5 * ROWS * n * x.element_size() + 3 * n * b.element_size()
    _bench(benchmark, f"bias_gelu_{approximate}", _grads(fn, (x, b), dy), nbytes)


@pytest.mark.parametrize("impl", IMPLS)
def test_cross_entropy(benchmark, impl):
    v = 50304 if CUDA else 32000
    n = ROWS if CUDA else 512
    # A non-leaf, as an lm_head output is: the Triton path overwrites it with the
    # gradient, and later rounds run on those values (same work, finite values).
    logits = (torch.randn(n, v, device=DEVICE, dtype=DTYPE) * 2).requires_grad_() * 1.0
    targets = torch.randint(0, v, (n,), device=DEVICE)
    fn = _select(impl, cross_entropy.cross_entropy_reference,
                 lambda x, t: cross_entropy.cross_entropy(x, t, impl="triton"))

    def run():
        torch.autograd.grad(fn(logits, targets), [logits])

    # read the logits and targets, write the loss and the gradient of the logits
    nbytes = 2 * n * v * logits.element_size() + n * targets.element_size() + 4
    _bench(benchmark, "cross_entropy", run, nbytes)


def _model_like_params():
    """A GPT-like list of fp32 tensors: per layer 4 matrices, 2 vectors and 4 norms."""
    h, layers = (1024, 12) if CUDA else (256, 6)
    shapes = [(50304 if CUDA else 8192, h)]
    for _ in range(layers):
        shapes += [(3 * h, h), (3 * h,), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,)]
        shapes += [(h,)] * 4
    torch.manual_seed(0)
    return [torch.randn(s, device=DEVICE) * 0.02 for s in shapes]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["adamw", "lamb"])
def test_optimizer_step(benchmark, method, impl):
    params = [p.requires_grad_() for p in _model_like_params()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    hp = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if method == "adamw":
        opt = torch.optim.AdamW(params, **hp, eps=1e-8, foreach=True)
        triton_step = multi_tensor.adamw_step
    else:
        lamb = pytest.importorskip("strategies.lamb")
        opt = lamb.Lamb(params, **hp, eps=1e-6, foreach=True)
        triton_step = multi_tensor.lamb_step
    if impl == "triton":
        _select(impl, None, None)  # skips off the GPU
        grads = [p.grad for p in params]
        ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        fn = functools.partial(triton_step, params, grads, ms, vs, 10, hp["lr"], 0.9, 0.95,
                               1e-8, 0.1, impl="triton")
    else:
        fn = _select(impl, opt.step, None)
    # read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq (fp32)
    nbytes = 7 * 4 * sum(p.numel() for p in params)
    _bench(benchmark, f"optimizer_{method}", torch.no_grad()(fn), nbytes)
