"""A device's profile, measured: what its kernels take by shape, for the estimator.

    harness calibrate                      measures this machine's CPU (or its GPU: --device)
    python -m training_harness.measure.device_profile cpu   ->  the profile as JSON

One peak FLOP rate per dtype cannot say that a 256-wide matmul runs at a fifth of a
4096-wide one, nor that a small model's step is mostly the host's time per operator.
The profile holds what the estimator needs to cost a step operator by operator
(training_harness.estimator.profiled_step):

    matmul       seconds per call of torch.mm on a grid of (m, n, k), per dtype
    convolution  seconds of a 3x3 convolution's forward, input gradient and weight
                 gradient on a grid of their GEMM's (m, n, k), per dtype (oneDNN's
                 convolutions are not torch.mm's GEMM)
    elementwise  seconds per call by bytes moved, per kind of operator (an add, a
                 transcendental like GELU, a layer norm, a batch norm, a softmax, a
                 reduction)
    attention    seconds of SDPA's forward and backward per (batch x head) by length
    optimizer    seconds of an optimizer step by tensors and elements, per kind
    op_overhead  the host's seconds per operator inside a training step: on a CPU beyond
                 what each call above takes alone (autograd's bookkeeping); on a GPU all
                 of it (the host issues kernels while the device runs earlier ones)
    first_touch  on a CPU, seconds per byte of memory written for the first time (a page
                 fault and the kernel's zeroing): the tables above are timed on warm
                 memory, and a step's memory is new pages each step (the allocator gives
                 back what the step freed)

Each figure is the best of groups of calls timed together, after a warm-up, with the
device synchronised. Nothing here is fitted on whole-model
steps: the estimator's error is judged on those (docs/estimator.md).
Measured in a process of its own, as the peak calibration is.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from training_harness.measure.peaks import device_name, peak_key, run_module

SCHEMA = 4  # 2: attention by dtype and mask; 3: elementwise by dtype; 4: convolutions,
# batch norm, matmuls and elementwise on warm outputs, first touch, attention one past
# each power of two
DIMS = (16, 64, 256, 1024, 4096)  # each of m, n and k
MAX_FLOPS = {"cpu": 4e9, "cuda": 1e13}  # larger grid points are left out (and clamped)
DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "tf32", "fp32")}
_TORCH = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}
# elements per elementwise call: 64 ... 4 M, outputs below glibc's largest mmap threshold
# (32 MiB), so warm pages: a larger output is new pages each call (first touch, costed
# per step); beyond the largest, the estimator keeps its bandwidth
SIZES = tuple(4**i for i in range(3, 12))
# a power of two and one past it: the kernels work in blocks, so a length just past one
# (a ViT's patches and its class token: 65, 197, 257) costs a block more, a step that
# interpolating between powers of two would smooth away
SEQS = (64, 65, 128, 129, 256, 257, 512, 513, 1024)
HEAD_DIM, ATTN_ROWS = 64, 8  # attention: (batch x heads) rows of head_dim 64
OPTIMIZERS = ("adamw-default", "adamw-foreach", "adamw-fused", "lamb-default", "lamb-foreach")
MIN_TIME_S = {"cpu": 0.02, "cuda": 0.005}
_time_scale = 1.0  # a quick profile times each point for a quarter of MIN_TIME_S


def measure(device: torch.device, quick: bool = False) -> dict[str, Any]:
    """The profile of `device`; `quick` measures a coarser grid (the tests)."""
    kind = device.type
    global _time_scale
    _time_scale = 0.25 if quick else 1.0
    dims = DIMS[::2] if quick else DIMS
    profile: dict[str, Any] = {
        "schema": SCHEMA, "device_type": kind, "device_name": device_name(device),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": quick,
        "how": "best of timed groups of calls (perf_counter, device synchronised), after a "
               "warm-up",
    }
    profile["matmul"] = {d: _matmuls(device, d, dims) for d in DTYPES[kind]
                         if _dtype_runs(device, d)}
    profile["elementwise"] = _elementwise(device, SIZES[::3] if quick else SIZES)
    conv_dims = {k: v[::2] if quick else v for k, v in CONV_DIMS.items()}
    profile["convolution"] = {d: _convolutions(device, d, conv_dims) for d in CONV_DTYPES[kind]
                              if _dtype_runs(device, d)}
    profile["attention"] = _attention(device, SEQS[::2] if quick else SEQS)
    profile["first_touch_s_per_byte"] = _first_touch(device)
    profile["optimizer"] = _optimizers(device)
    profile["op_overhead_s"] = _op_overhead(device, profile)
    return profile


def _dtype_runs(device: torch.device, dtype: str) -> bool:
    try:
        a = torch.ones(8, 8, device=device, dtype=_TORCH[dtype])
        (a @ a).sum().item()
        return True
    except RuntimeError:
        return False


def timed(fn: Callable[[], Any], device: torch.device, min_time_s: float | None = None) -> float:
    """Seconds per call of `fn`: the best of groups of calls, each group long enough for
    the clock, after a warm-up; the device is synchronised around each group. The best,
    not the median: another process's load only ever slows a call down."""
    min_time_s = min_time_s or MIN_TIME_S[device.type] * _time_scale
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(min_time_s / 5 / once))
    times = []
    deadline = time.perf_counter() + min_time_s
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 50):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / reps)
    return min(times)


def _matmuls(device: torch.device, dtype: str, dims: tuple[int, ...]) -> list[list[float]]:
    """[m, n, k, seconds] for torch.mm of (m x k) @ (k x n), FLOPs capped."""
    rows = []
    tf32 = torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        for m in dims:
            for n in dims:
                for k in dims:
                    if 2 * m * n * k > MAX_FLOPS[device.type]:
                        continue
                    a = torch.randn(m, k, device=device, dtype=_TORCH[dtype])
                    b = torch.randn(k, n, device=device, dtype=_TORCH[dtype])
                    c = torch.empty(m, n, device=device, dtype=_TORCH[dtype])
                    # into the same output each call: on a CPU a new one above the
                    # allocator's mmap threshold is new pages each call, and new pages
                    # are costed once per step (first_touch), not per kernel
                    rows.append([m, n, k, timed(lambda a=a, b=b, c=c: torch.mm(a, b, out=c),
                                                device)])
    finally:
        if tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
    return rows


CONV_DIMS = {"m": (256, 2048, 16384), "c": (16, 64, 256)}  # batch x positions; channels
# the dtypes convolutions train in (others are costed as GEMMs): the calibration stays short
CONV_DTYPES = {"cpu": ("fp32",), "cuda": ("bf16", "fp32")}


def _convolutions(device: torch.device, dtype: str, dims: dict[str, tuple[int, ...]]
                  ) -> dict[str, list[list[float]]]:
    """{"forward"|"input"|"weight": [[m, n, k, seconds], ...]}: a 3x3 convolution (stride
    1, padding 1) of c_in to c_out channels on m = batch x 16 x 16 positions, keyed by its
    GEMM (m, n = c_out, k = 9 c_in); its backward's input and weight gradients timed
    apart. FLOPs capped as the matmuls'."""
    table: dict[str, list[list[float]]] = {"forward": [], "input": [], "weight": []}
    for m in dims["m"]:
        for c_out in dims["c"]:
            for c_in in dims["c"]:
                if 2 * m * c_out * 9 * c_in > MAX_FLOPS[device.type]:
                    continue
                x = torch.randn(max(1, m // 256), c_in, 16, 16, device=device,
                                dtype=_TORCH[dtype])
                w = torch.randn(c_out, c_in, 3, 3, device=device, dtype=_TORCH[dtype])
                y = F.conv2d(x, w, padding=1)
                key = [m, c_out, 9 * c_in]
                table["forward"].append(key + [timed(lambda x=x, w=w: F.conv2d(
                    x, w, padding=1), device)])
                for part, mask in (("input", (True, False, False)),
                                   ("weight", (False, True, False))):
                    table[part].append(key + [timed(
                        lambda x=x, w=w, y=y, mask=mask: torch.ops.aten.convolution_backward(
                            y, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask),
                        device)])
    return table


def _first_touch(device: torch.device) -> float:
    """Seconds per byte of writing memory new to the process, beyond writing warm memory:
    64 MiB, above glibc's largest mmap threshold (32 MiB), is new pages each allocation.
    0 on a GPU (its caching allocator keeps what a step frees)."""
    if device.type != "cpu":
        return 0.0
    n = 64 * 2**20
    warm = torch.empty(n, dtype=torch.uint8)
    fresh_s = timed(lambda: torch.empty(n, dtype=torch.uint8).fill_(1), device)
    warm_s = timed(lambda: warm.fill_(1), device)
    return max(0.0, (fresh_s - warm_s) / n)


# The kinds of elementwise operator, each a call of its own shape: bytes moved per call
# are the inputs' and the output's (fp32 here; the estimator scales by bytes).
ELEMENTWISE: dict[str, tuple[int, Callable[[torch.Tensor, torch.Tensor], Any]]] = {
    "binary": (3, lambda x, y: torch.add(x, y)),
    "transcendental": (2, lambda x, y: F.gelu(x, approximate="tanh")),
    "norm": (2, lambda x, y: F.layer_norm(x, x.shape[-1:])),
    # per channel over batch and positions: strided passes, not a row's
    "batch_norm": (2, lambda x, y: F.batch_norm(x.view(x.shape[0], -1, 4, 4), None, None,
                                                training=True)),
    "softmax": (2, lambda x, y: torch.softmax(x, -1)),
    "reduction": (1, lambda x, y: x.sum(-1)),
}


def _elementwise(device: torch.device, sizes: tuple[int, ...]
                 ) -> dict[str, dict[str, list[list[float]]]]:
    """{dtype: {kind: [[bytes moved, seconds], ...]}} on rows of 256, fp32 and bf16: a
    CPU converts bf16 element by element, so its bytes cost more than fp32's."""
    table: dict[str, dict[str, list[list[float]]]] = {}
    for dtype in ("fp32", "bf16"):
        if not _dtype_runs(device, dtype):
            continue
        kinds: dict[str, list[list[float]]] = {}
        for kind, (tensors, fn) in ELEMENTWISE.items():
            rows = []
            for size in sizes:
                x = torch.randn(max(1, size // 256), min(size, 256), device=device,
                                dtype=_TORCH[dtype])
                y = torch.randn_like(x)
                rows.append([tensors * x.numel() * x.element_size(),
                             timed(lambda x=x, y=y, fn=fn: fn(x, y), device)])
            kinds[kind] = rows
        x = torch.randn(4, 4, device=device)
        kinds["view"] = [[0, timed(lambda x=x: x.view(16).t(), device) / 2]]
        table[dtype] = kinds
    return table


def _attention(device: torch.device, seqs: tuple[int, ...]
               ) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """{dtype: {"causal"|"full": {"forward"|"backward": [[seq, seconds per (batch x head)
    row], ...]}}}: SDPA with head_dim HEAD_DIM, in each dtype the device runs."""
    table: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for dtype in ("fp32", "bf16"):
        if not _dtype_runs(device, dtype):
            continue
        table[dtype] = {}
        for causal in (True, False):
            fwd, bwd = [], []
            for s in seqs:
                q, k, v = (torch.randn(1, ATTN_ROWS, s, HEAD_DIM, device=device,
                                       dtype=_TORCH[dtype], requires_grad=True)
                           for _ in range(3))
                f = timed(lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(
                    q, k, v, is_causal=c), device)
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                grad = torch.ones_like(out)
                b = timed(lambda o=out, g=grad, q=q, k=k, v=v: torch.autograd.grad(
                    o, (q, k, v), g, retain_graph=True), device)
                fwd.append([s, f / ATTN_ROWS])
                bwd.append([s, b / ATTN_ROWS])
            table[dtype]["causal" if causal else "full"] = {"forward": fwd, "backward": bwd}
    return table


def _optimizers(device: torch.device) -> dict[str, list[float]]:
    """{kind: [seconds per tensor, seconds per element]}: each optimizer's step timed over
    many small tensors and over a few large ones, solved for the two costs."""
    shapes = ((256, 256), (4, 2**20))  # (tensors, elements each)
    result = {}
    for kind in OPTIMIZERS:
        (t1, e1), (t2, e2) = shapes
        s1, s2 = (_optimizer_step(device, kind, t, e) for t, e in shapes)
        # s = a·tensors + b·elements in all, two equations
        det = t1 * t2 * e2 - t1 * e1 * t2
        a = (s1 * t2 * e2 - t1 * e1 * s2) / det
        b = (t1 * s2 - t2 * s1) / det
        result[kind] = [max(a, 0.0), max(b, 0.0)]
    return result


def _optimizer_step(device: torch.device, kind: str, tensors: int, elements: int) -> float:
    from training_harness.strategies.lamb import Lamb

    params = [torch.zeros(elements, device=device, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    name, impl = kind.split("-")
    flags = {"foreach": {"foreach": True}, "fused": {"fused": True}, "default": {}}[impl]
    opt = (Lamb(params, lr=1e-3, **flags) if name == "lamb"
           else torch.optim.AdamW(params, lr=1e-3, **flags))
    return timed(opt.step, device)


def _op_overhead(device: torch.device, profile: dict[str, Any]) -> float:
    """The host's seconds per operator in a training step beyond the operators' own
    calls: a step of a tiny MLP (width 8, so every kernel is all overhead), less its
    operators' own figures from the tables above, over its operator count."""
    from training_harness.estimator.op_trace import trace_callable
    from training_harness.estimator.profiled_step import DeviceProfile, ops_seconds

    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
                                  for _ in range(8)]).to(device)
    x = torch.randn(4, 8, device=device)

    def step() -> None:
        loss = model(x).square().mean()
        loss.backward()

    total = timed(step, device)
    ops = trace_callable(step)
    count = max(1, sum(op.count for op in ops))
    if device.type == "cuda":  # the host issues while the GPU runs: a tiny step is all host
        return total / count
    own = ops_seconds(ops, DeviceProfile({**profile, "op_overhead_s": 0.0}))
    return max(0.0, (total - own) / count)


CACHE_FILE = "profiles.json"
PROFILE_TIMEOUT_S = 600.0


def cached_profile(device: torch.device, name: str | None = None) -> dict[str, Any] | None:
    """This device's measured profile from the machine's cache (`harness calibrate`
    measures it), or None; `name`, the device's name where the caller knows it."""
    from training_harness.measure import cache

    try:
        key = cache_key(device, name)
    except Exception:  # noqa: BLE001 - a device this process cannot identify has none
        return None
    entry = cache.read(CACHE_FILE).get(key)
    return entry if isinstance(entry, dict) and entry.get("schema") == SCHEMA else None


def calibrate(device: torch.device, quick: bool = False) -> dict[str, Any]:
    """Measure `device`'s profile in a process of its own (its CUDA context ends with
    it), keep it in the machine's cache, and return it."""
    from training_harness.measure import cache

    argv = [str(device)] + (["--quick"] if quick else [])
    profile = json.loads(run_module("training_harness.measure.device_profile", argv,
                                    PROFILE_TIMEOUT_S, f"the profile of {device}"))
    cache.add(CACHE_FILE, {cache_key(device): profile})
    return profile


def cache_key(device: torch.device, name: str | None = None) -> str:
    """What the figures depend on: the peak calibration's key (device, threads, flags,
    torch)."""
    return peak_key(device, name or device_name(device), "profile")


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    quick = "--quick" in args
    device = torch.device(next((a for a in args if not a.startswith("--")), "cpu"))
    print(json.dumps(measure(device, quick=quick)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
