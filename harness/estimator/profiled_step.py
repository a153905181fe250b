"""A step's time from a measured device profile: its traced operators, each costed by
what a call of its shape took on the device (training_harness.measure.device_profile).

    step = micro-steps x (sum of the operators' times + operators x op_overhead
                          + the micro-step's transient memory x first_touch)
           + the optimizer's step (per tensor and per element, by optimizer)

On a CPU the host runs each operator itself, so the times add up. The profile's kernels
are timed on warm memory; the memory a micro-step takes beyond what persists between
steps (activations, gradients, temporaries: the estimator's peak phase) is given back
when the step frees it (glibc trims its heap; allocations above its mmap threshold are
unmapped), so each micro-step writes it to new pages again. Lookups between the
profile's measured points interpolate in log-log space (a matmul's rate over log m,
log n, log k); beyond its largest points a matmul keeps the largest measured rate and
an elementwise operator the largest measured bandwidth.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Any

from training_harness.estimator.op_trace import Op

MATMUL_DTYPE = {2: "bf16", 4: "fp32"}


class DeviceProfile:
    """Lookups into a measured profile (its JSON as a dict)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.op_overhead_s = float(data.get("op_overhead_s", 0.0))
        self._grids = {d: _Grid(rows) for d, rows in data.get("matmul", {}).items() if rows}
        self._convs = {d: {part: _Grid(rows) for part, rows in parts.items() if rows}
                       for d, parts in data.get("convolution", {}).items()}
        self.first_touch_s_per_byte = float(data.get("first_touch_s_per_byte", 0.0))

    @property
    def device_type(self) -> str:
        return self.data.get("device_type", "cpu")

    def describe(self) -> str:
        d = self.data
        return (f"the device profile of {d.get('device_name', '?')} ({d.get('threads', '?')} "
                f"threads, torch {d.get('torch', '?')}), measured {d.get('measured_at', '?')}")

    def matmul_s(self, m: int, n: int, k: int, itemsize: int) -> float:
        dtype = MATMUL_DTYPE.get(itemsize, "fp32")
        grid = self._grids.get(dtype) or self._grids.get("fp32") or next(iter(self._grids.values()))
        return 2 * m * n * k / grid.rate(m, n, k)

    def convolution_s(self, op: Op) -> float:
        """A convolution's forward or backward from the convolution table of its dtype;
        where the profile has none, the GEMMs of its FLOPs (one per gradient)."""
        parts = (["forward"] if op.kind == "convolution"
                 else op.kind.removeprefix("convolution_backward_").split("_"))
        grids = self._convs.get(MATMUL_DTYPE.get(op.itemsize, "fp32"), {})
        flops = 2 * op.m * op.n * op.k
        return sum(flops / grids[p].rate(op.m, op.n, op.k) if p in grids
                   else self.matmul_s(op.m, op.n, op.k, op.itemsize) for p in parts if p)

    def elementwise_s(self, kind: str, nbytes: int, itemsize: int = 4) -> float:
        tables = self._elementwise(itemsize)
        return _loglog(tables.get(kind) or tables["binary"], max(nbytes, 1), extend=1.0)

    def view_s(self) -> float:
        return float(self._elementwise(4)["view"][0][1])

    def _elementwise(self, itemsize: int) -> dict[str, list[list[float]]]:
        """The elementwise tables of the dtype of that width (bf16 for 2 bytes)."""
        by_dtype = self.data["elementwise"]
        return by_dtype.get(MATMUL_DTYPE.get(itemsize, "fp32")) or by_dtype["fp32"]

    def attention_s(self, op: Op) -> float:
        by_dtype = self.data["attention"]
        dtype = MATMUL_DTYPE.get(op.itemsize, "fp32")
        tables = by_dtype.get(dtype) or by_dtype.get("fp32") or next(iter(by_dtype.values()))
        table = tables["causal" if op.causal else "full"][
            "forward" if op.kind == "attention_forward" else "backward"]
        return _loglog(table, op.n, extend=2.0) * op.k / 64 * op.m

    def optimizer_s(self, kind: str, tensors: int, elements: int) -> tuple[float, str]:
        """Seconds of one optimizer step, and the profile entry used (named)."""
        table = self.data.get("optimizer", {})
        used = kind if kind in table else "adamw-default"
        per_tensor, per_element = table[used]
        return per_tensor * tensors + per_element * elements, used


class _Grid:
    """A rate (FLOP/s) on a measured (m, n, k) grid, interpolated over the logs; each axis
    has its own points (a convolution's k is 9 x its channels)."""

    def __init__(self, rows: list[list[float]]) -> None:
        self.dims = [sorted({int(r[axis]) for r in rows}) for axis in range(3)]
        self.logs = [[math.log(d) for d in dims] for dims in self.dims]
        rate = {(int(m), int(n), int(k)): 2 * m * n * k / s for m, n, k, s in rows}
        # Points left out (too many FLOPs to time) take the best rate measured at
        # dimensions no larger: large matmuls run at least as fast as smaller ones.
        self.log_rate: dict[tuple[int, int, int], float] = {}
        for key in itertools.product(*self.dims):
            r = rate.get(key)
            if r is None:
                r = max((v for (m, n, k), v in rate.items()
                         if m <= key[0] and n <= key[1] and k <= key[2]), default=None)
            self.log_rate[key] = math.log(r) if r else 0.0

    def rate(self, m: int, n: int, k: int) -> float:
        corners = [_bracket(logs, x) for logs, x in zip(self.logs, (m, n, k), strict=True)]
        total = 0.0
        for (i, wi), (j, wj), (h, wh) in itertools.product(*corners):
            w = wi * wj * wh
            if w:
                total += w * self.log_rate[(self.dims[0][i], self.dims[1][j], self.dims[2][h])]
        return math.exp(total)


def _bracket(logs: list[float], x: int) -> list[tuple[int, float]]:
    """The indices of `logs` around log(x) with their weights (clamped at the ends)."""
    lx = math.log(max(x, 1))
    if lx <= logs[0]:
        return [(0, 1.0)]
    if lx >= logs[-1]:
        return [(len(logs) - 1, 1.0)]
    i = bisect.bisect_right(logs, lx) - 1
    t = (lx - logs[i]) / (logs[i + 1] - logs[i])
    return [(i, 1 - t), (i + 1, t)]


def _loglog(table: list[list[float]], x: float, extend: float) -> float:
    """y at x from [[x, y], ...] interpolated in log-log; below the first point its y,
    beyond the last y grows as x**extend."""
    xs = [float(r[0]) for r in table]
    ys = [float(r[1]) for r in table]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * (x / xs[-1]) ** extend
    i = bisect.bisect_right(xs, x) - 1
    t = (math.log(x) - math.log(xs[i])) / (math.log(xs[i + 1]) - math.log(xs[i]))
    return math.exp((1 - t) * math.log(ys[i]) + t * math.log(ys[i + 1]))


def op_seconds(op: Op, profile: DeviceProfile) -> float:
    """One call of `op` alone, by the profile."""
    if op.kind == "matmul":
        return profile.matmul_s(op.m, op.n, op.k, op.itemsize)
    if op.kind.startswith("convolution"):
        return profile.convolution_s(op)
    if op.kind.startswith("attention"):
        return profile.attention_s(op)
    if op.kind == "view":
        return profile.view_s()
    return profile.elementwise_s(op.kind, op.bytes, op.itemsize)


def ops_seconds(ops: list[Op], profile: DeviceProfile) -> float:
    """The operators' own times plus the host's overhead per operator."""
    return sum(op.count * (op_seconds(op, profile) + profile.op_overhead_s) for op in ops)


@dataclass
class ProfiledStep:
    """A step's seconds by the profile, its parts, and the sentence saying how."""

    seconds: float
    parts: dict[str, float]
    how: str


def profiled_step(ops: list[Op], microsteps: int, optimizer: str, tensors: int,
                  elements: int, profile: DeviceProfile, bubble: float = 0.0,
                  graphs: bool = False, transient_bytes: int = 0) -> ProfiledStep:
    """The step of `microsteps` forward-backward passes of `ops` and one optimizer step
    over `tensors` parameter tensors of `elements` elements in all; `transient_bytes`,
    the memory a micro-step takes beyond what persists between steps (its peak)."""
    by_kind: dict[str, float] = {}
    for op in ops:
        group = next((g for g in ("matmul", "convolution", "attention")
                      if op.kind.startswith(g)), "other")
        by_kind[group] = by_kind.get(group, 0.0) + op.count * op_seconds(op, profile)
    by_kind["first touch"] = transient_bytes * profile.first_touch_s_per_byte
    calls = sum(op.count for op in ops)
    overhead = calls * profile.op_overhead_s
    busy = sum(by_kind.values())
    # A CPU runs each operator itself: the times add up. A GPU runs kernels while the host
    # issues the next ones: the longer of the two (CUDA graphs replay without the host).
    if profile.device_type == "cuda":
        micro = busy if graphs else max(busy, overhead)
    else:
        micro = busy + overhead
    opt, used = profile.optimizer_s(optimizer, tensors, elements)
    seconds = microsteps * micro / (1 - bubble) + opt
    # the parts the tuner re-weights (training_harness.estimator.result.STEP_PARTS): every
    # operator's own time is the device's busy time, the host's overhead its launches
    parts = {"compute": microsteps * busy,
             "launches": microsteps * (0.0 if graphs else overhead), "optimizer": opt,
             "bubble": microsteps * micro * bubble / (1 - bubble)}
    named = ", ".join(f"{'other operators' if g == 'other' else g} {t * 1e3:.3g} ms"
                      for g, t in by_kind.items() if t)
    how = (f"Step time from {profile.describe()}: {microsteps} micro-step(s) x {calls} traced "
           f"operators ({named}, host overhead {overhead * 1e3:.3g} ms; first touch: "
           f"{transient_bytes / 2**20:.0f} MiB of new pages) + optimizer step "
           f"{opt * 1e3:.3g} ms ({used}, {tensors} tensors); data loading is not counted.")
    return ProfiledStep(seconds, parts, how)


_TRACED: dict[tuple[str, int, str], list[Op] | str] = {}  # traces (or why not) in this process


def plan_step(plan: Any, workload: Any, cfg: Any, facts: Any, profile: DeviceProfile,
              bubble: float, workload_key: str | None, transient_bytes: int = 0
              ) -> ProfiledStep | str:
    """The plan's step by the profile, or why it cannot be costed so (in words): one
    device only (communication is not in the profile), a step fake tensors can trace.
    `transient_bytes`: the estimator's peak phase (memory beyond the persistent state)."""
    import json

    from training_harness.estimator.op_trace import StepTraceFailed, trace_step
    from training_harness.estimator.step_costs import COMPILED_KERNELS
    from training_harness.strategies.fused import CUDA_GRAPHS

    if plan.world_size > 1:
        return "the profile holds no communication: plans on several devices"
    if "distill" in plan.strategies:
        return "distillation's teacher is not traced"
    key = (workload_key or f"{plan.workload}{plan.workload_args}", plan.micro_batch_size,
           json.dumps(plan.strategies, sort_keys=True, default=str))
    if key not in _TRACED:
        try:
            _TRACED[key] = trace_step(plan, workload, plan.micro_batch_size)
        except StepTraceFailed as e:
            _TRACED[key] = f"its step could not be traced ({e})"
    ops = _TRACED[key]
    if isinstance(ops, str):
        return ops
    if cfg.compile:  # compile fuses the element-wise operators: this share is left
        ops = [op if op.kind.startswith(("matmul", "convolution", "attention"))
               else Op(**{**op.__dict__, "count": max(1, round(op.count * COMPILED_KERNELS))})
               for op in ops]
    trained = [p for p in facts.params if p.trainable]
    impl = cfg.optimizer_impl
    graphs = cfg.compile and cfg.compile_mode in CUDA_GRAPHS
    step = profiled_step(ops, max(1, plan.accumulation_steps), f"{cfg.optimizer}-{impl}",
                         len(trained), sum(p.numel for p in trained), profile, bubble, graphs,
                         transient_bytes)
    if cfg.compile:
        step.how += (f" torch.compile is costed as the eager step with {COMPILED_KERNELS:g} of "
                     "its element-wise operators left (fused).")
    return step
