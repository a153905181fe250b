"""The calibration: a device's peak matmul rate, measured in a process of its own and gone.

    python -m training_harness.measure.calibrate cuda:0 bf16 tf32
        ->  {"bf16": {"flops": ..., "source": ...}, "tf32": {...}}
    python -m training_harness.measure.calibrate --overhead cuda:0
        ->  {"context_bytes": ..., "workspace_bytes": ..., ...}  (device_overhead.py)

Started by `training_harness.measure.peaks.measured_peak` on a cache miss. Besides a trial's
ranks it is the only process that touches a GPU: its CUDA context lives for the few
seconds of the matmuls and ends with it. (On a CPU it runs the same way, so that no
process that prepares trials ever runs the calibration itself.) The dtype comes
resolved ("tf32", not "fp32" with TF32 on): the caller's TF32 settings decide it.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict

import torch

_TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
                "fp16": torch.float16}
CPU_MIN_TIME_S = 0.5  # the CPU calibration's timed runs go on at least this long
CUDA_WARMUP_S = 1.0  # clocks ramp up from idle over about a second of load
CUDA_MIN_TIME_S = 1.0  # then the best of the timed runs within at least this long


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--overhead":
        from training_harness.measure.device_overhead import measure

        print(json.dumps(asdict(measure(torch.device(args[1])))), flush=True)
        return 0
    device, *dtypes = args
    peaks = {}
    for d in dtypes:
        flops, source = measure_peak(torch.device(device), d)
        peaks[d] = {"flops": flops, "source": source}
    print(json.dumps(peaks), flush=True)
    return 0


def measure_peak(device: torch.device, dtype: str) -> tuple[float, str]:
    """The peak FLOP/s of `dtype` on `device` and how it was measured, in words: on CUDA
    an 8192² matmul (smaller when memory is short), timed with CUDA events; on a CPU
    the size that takes 25 ms or more."""
    tdtype = _TORCH_DTYPE[dtype]
    if device.type == "cuda":
        runs, reps = 10, 4
        tf32 = dtype in ("fp32", "tf32") and torch.version.hip is None
        for n in (8192, 4096, 2048):
            try:
                with _tf32(dtype == "tf32") if tf32 else contextlib.nullcontext():
                    seconds, runs = _benchmark_matmul(device, tdtype, n, runs, reps,
                                                      CUDA_MIN_TIME_S)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        else:
            raise RuntimeError(f"calibration matmul does not fit in the memory of {device}")
        note = {"tf32": " (float32 tensors on TF32 tensor cores)", "fp32": " (TF32 off)"}.get(
            dtype, "")
        how = f"best of {runs} runs of {reps}, CUDA events"
    else:
        n = _cpu_size(tdtype)
        seconds, runs = _benchmark_matmul(device, tdtype, n, 5, 1, min_time_s=CPU_MIN_TIME_S)
        note = f" ({torch.get_num_threads()} threads)"
        how = f"best of {runs}, perf_counter"
    flops = 2 * n**3 / seconds
    if not (math.isfinite(flops) and flops > 0):
        raise RuntimeError(f"calibration matmul on {device} gave no usable time ({seconds} s)")
    return flops, f"measured: {n}x{n} {dtype} matmul{note}, {how}"


@contextlib.contextmanager
def _tf32(on: bool):
    """TF32 on (or off) for CUDA float32 matmuls inside the block, then as it was."""
    matmul = torch.backends.cuda.matmul
    new_api = hasattr(matmul, "fp32_precision")
    attr = "fp32_precision" if new_api else "allow_tf32"
    old = getattr(matmul, attr)
    setattr(matmul, attr, ("tf32" if on else "ieee") if new_api else on)
    try:
        yield
    finally:
        setattr(matmul, attr, old)


def _cpu_size(dtype: torch.dtype, target_s: float = 0.025) -> int:
    """The smallest of 256..2048 (doubling) whose matmul takes `target_s` or more here."""
    cpu = torch.device("cpu")
    n = 256
    while n < 2048 and _benchmark_matmul(cpu, dtype, n, runs=1, reps=1)[0] < target_s:
        n *= 2
    return n


def _benchmark_matmul(device: torch.device, dtype: torch.dtype, n: int, runs: int, reps: int,
                      min_time_s: float = 0.0) -> tuple[float, int]:
    """Best seconds per n x n matmul, and the number of timed runs of `reps` matmuls.

    At least `runs` runs, more (up to 10x) until `min_time_s` has passed: on a
    shared machine the best of many short runs is the one nobody interrupted.
    """
    best, done = math.inf, 0
    a = b = out = None
    try:
        # a generator of its own, so the trial's seeded global RNG is left alone
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        _warm_up(device, a, b, out)
        t0 = time.perf_counter()
        while done < runs or (done < 10 * runs and time.perf_counter() - t0 < min_time_s):
            best = min(best, _timed(device, a, b, out, reps) / reps)
            done += 1
    finally:
        del a, b, out
        if device.type == "cuda":
            torch.cuda.empty_cache()  # give the calibration's blocks back before the trial
    return best, done


def _warm_up(device: torch.device, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """Kernel selection; on CUDA also the clocks, up from idle (about a second of load)."""
    if device.type != "cuda":
        for _ in range(2):
            torch.mm(a, b, out=out)
        return
    t0 = time.perf_counter()
    for i in range(10_000):
        torch.mm(a, b, out=out)
        if i >= 2:
            torch.cuda.synchronize(device)
            if time.perf_counter() - t0 > CUDA_WARMUP_S:
                break


def _timed(device: torch.device, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
           reps: int) -> float:
    """Seconds of `reps` matmuls: CUDA events on a GPU, perf_counter on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    t1 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b, out=out)
    return time.perf_counter() - t1


if __name__ == "__main__":
    sys.exit(main())
