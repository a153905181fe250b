"""The measured peak FLOP/s of a device (the figure MFU falls back on).

The best rate of a square calibration matmul on the device, cached per (device
name, dtype, torch version, and threads on CPU) in $HARNESS_CACHE_DIR/peaks.json
so it is measured once. The matmul runs in a short-lived process of its own
(harness.measure.calibrate): on a GPU a CUDA context made here would stay on the
trials' device for as long as the calling process (the tuner's helper, the bench
launcher) lives, holding memory and skewing NVML's readings. A process that is
short-lived itself and ends before the trial starts (the rank server's fork that
prepares `harness bench`'s plan) runs it in place (`calibrate_here`).
`harness.measure.peaks` holds the datasheet (this module imports `Peak` and
`matmul_dtype` from there); `harness.measure.peak_choice` chooses between the two.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from harness.measure.peaks import Peak, _check_dtype, matmul_dtype

_TORCH_DTYPE = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

CACHE_FILE = "peaks.json"
CPU_MIN_TIME_S = 0.5  # the CPU calibration's timed runs go on at least this long
CUDA_WARMUP_S = 1.0  # clocks ramp up from idle over about a second of load
CUDA_MIN_TIME_S = 1.0  # then the best of the timed runs within at least this long
CALIBRATION_TIMEOUT_S = 300.0
_CACHE_VERSION = 1


# --- the per-device cache -------------------------------------------------------


def cache_dir() -> Path:
    """$HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/training-harness, else ~/.cache/training-harness."""
    if env := os.environ.get("HARNESS_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "training-harness"


def _cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def _read_cache(path: Path) -> dict[str, Any]:
    """The cached entries; an absent, unreadable or corrupt file counts as empty."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    """Write atomically (temporary file + rename); a cache that cannot be written is skipped."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".peaks.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": _CACHE_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _valid_entry(entry: Any) -> Peak | None:
    if not isinstance(entry, dict):
        return None
    flops, source = entry.get("flops"), entry.get("source")
    if (
        isinstance(flops, int | float)
        and math.isfinite(flops)
        and flops > 0
        and isinstance(source, str)
    ):
        return Peak(float(flops), source)
    return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from harness.core.device import cpu_name

    return cpu_name()


def _cache_key(device: torch.device, device_name: str, dtype: str) -> str:
    """Everything the rate depends on: the device (on a CPU its instruction set and the
    threads torch may use, since one model name comes with AVX2 or AVX-512 BF16; on a
    GPU its UUID and top SM clock, so another card or a clock cap is measured anew),
    the dtype and torch."""
    key = f"{device.type}|{device_name}|{dtype}|torch {torch.__version__}"
    if device.type == "cpu":
        from harness.core.device import cpu_capability, cpu_flags

        key += f"|threads {torch.get_num_threads()}|{cpu_capability()}|{','.join(cpu_flags())}"
    elif device.type == "cuda":
        key += f"|{_gpu_identity(device)}"
    return key


def _gpu_identity(device: torch.device) -> str:
    """The GPU's UUID and its top SM clock (NVML; no CUDA context), as far as known."""
    from harness.measure.nvml import gpu_identity

    return gpu_identity(device)


# --- the calibration matmul -----------------------------------------------------


class _Tf32:
    """Force TF32 on (or off) for CUDA float32 matmuls inside the block, then restore."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.matmul = torch.backends.cuda.matmul
        self.new_api = hasattr(self.matmul, "fp32_precision")

    def __enter__(self) -> None:
        if self.new_api:
            self.old = self.matmul.fp32_precision
            self.matmul.fp32_precision = "tf32" if self.on else "ieee"
        else:
            self.old = self.matmul.allow_tf32
            self.matmul.allow_tf32 = self.on

    def __exit__(self, *exc: object) -> None:
        if self.new_api:
            self.matmul.fp32_precision = self.old
        else:
            self.matmul.allow_tf32 = self.old


def _benchmark_matmul(
    device: torch.device,
    dtype: torch.dtype,
    n: int,
    runs: int,
    reps: int,
    min_time_s: float = 0.0,
) -> tuple[float, int]:
    """Best seconds per n x n matmul, and the number of timed runs of `reps` matmuls.

    At least `runs` runs, more (up to 10x) until `min_time_s` has passed: on a
    shared machine the best of many short runs is the one nobody interrupted.
    """
    best = math.inf
    done = 0
    a = b = out = None
    try:
        # a generator of its own, so the trial's seeded global RNG is left alone
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        if device.type == "cuda":
            # warm-up: kernel selection, and clocks up from idle
            t0 = time.perf_counter()
            for i in range(10_000):
                torch.mm(a, b, out=out)
                if i >= 2:
                    torch.cuda.synchronize(device)
                    if time.perf_counter() - t0 > CUDA_WARMUP_S:
                        break
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            while done < runs or (done < 10 * runs and time.perf_counter() - t0 < min_time_s):
                start.record()
                for _ in range(reps):
                    torch.mm(a, b, out=out)
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1000.0 / reps)
                done += 1
        else:
            for _ in range(2):
                torch.mm(a, b, out=out)
            t0 = time.perf_counter()
            while done < runs or (done < 10 * runs and time.perf_counter() - t0 < min_time_s):
                t1 = time.perf_counter()
                for _ in range(reps):
                    torch.mm(a, b, out=out)
                best = min(best, (time.perf_counter() - t1) / reps)
                done += 1
    finally:
        del a, b, out
        if device.type == "cuda":
            torch.cuda.empty_cache()  # give the calibration's blocks back before the trial
    return best, done


def _cpu_size(dtype: torch.dtype, target_s: float = 0.025) -> int:
    """The smallest of 256..2048 (doubling) whose matmul takes `target_s` or more here."""
    cpu = torch.device("cpu")
    n = 256
    while n < 2048 and _benchmark_matmul(cpu, dtype, n, runs=1, reps=1)[0] < target_s:
        n *= 2
    return n


def _measure(device: torch.device, dtype: str) -> Peak:
    tdtype = _TORCH_DTYPE[dtype]
    if device.type == "cuda":
        runs, reps = 10, 4
        seconds = math.inf
        for n in (8192, 4096, 2048):  # smaller when memory is short
            try:
                args = (device, tdtype, n, runs, reps, CUDA_MIN_TIME_S)
                if dtype in ("fp32", "tf32") and torch.version.hip is None:
                    with _Tf32(dtype == "tf32"):
                        seconds, runs = _benchmark_matmul(*args)
                else:
                    seconds, runs = _benchmark_matmul(*args)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        else:
            raise RuntimeError(f"calibration matmul does not fit in the memory of {device}")
        note = {"tf32": " (float32 tensors on TF32 tensor cores)", "fp32": " (TF32 off)"}.get(
            dtype, ""
        )
        how = f"best of {runs} runs of {reps}, CUDA events"
    else:
        n = _cpu_size(tdtype)
        seconds, runs = _benchmark_matmul(device, tdtype, n, 5, 1, min_time_s=CPU_MIN_TIME_S)
        note = f" ({torch.get_num_threads()} threads)"
        how = f"best of {runs}, perf_counter"
    flops = 2 * n**3 / seconds
    if not (math.isfinite(flops) and flops > 0):
        raise RuntimeError(f"calibration matmul on {device} gave no usable time ({seconds} s)")
    return Peak(flops, f"measured: {n}x{n} {dtype} matmul{note}, {how}")


# --- the measured peak ---------------------------------------------------------


def measured_peak(device: torch.device, dtype: str, *, cache: bool = True) -> Peak:
    """The best rate of a square `dtype` matmul on `device`, in FLOP/s (2·n³ per matmul).

    "fp32" on CUDA is measured under the current TF32 setting (reported as "tf32"
    when TF32 is on, see `matmul_dtype`); "tf32" forces TF32 for the measurement.
    With `cache`, the figure is read from and stored in $HARNESS_CACHE_DIR/peaks.json,
    keyed by device name, dtype and torch version (and threads on CPU).
    """
    _check_dtype(dtype)
    return measured_peaks(device, [dtype], cache=cache)[matmul_dtype(_indexed(device), dtype)]


def measured_peaks(
    device: torch.device, dtypes: list[str], *, cache: bool = True
) -> dict[str, Peak]:
    """`measured_peak` of several dtypes, keyed by the dtype each ran in; the ones not
    cached are measured together, in one calibration process (also on a CPU: the
    process that asks, the tuner's helper or `harness bench`, never runs the matmul)."""
    for dtype in dtypes:
        _check_dtype(dtype)
    device = _indexed(device)
    wanted = list(dict.fromkeys(matmul_dtype(device, d) for d in dtypes))
    keys = {d: _cache_key(device, _device_name(device), d) for d in wanted}
    path = _cache_path()
    found: dict[str, Peak] = {}
    if cache:
        entries = _read_cache(path)
        for d in wanted:
            if (hit := _valid_entry(entries.get(keys[d]))) is not None:
                found[d] = hit
    missing = [d for d in wanted if d not in found]
    if missing:
        measured = ({d: _measure(device, d) for d in missing} if _here
                    else _measure_in_subprocess(device, missing))
        found.update(measured)
        if cache:
            entries = _read_cache(path)  # re-read: another process may have added entries
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            for d, peak in measured.items():
                entries[keys[d]] = {**asdict(peak), "measured_at": stamp}
            _write_cache(path, entries)
    return found


def _indexed(device: torch.device) -> torch.device:
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def forget_measured_peak(device: torch.device, dtype: str) -> None:
    """Drop the cached figure: a trial ran faster than it, so it was measured low (on a
    loaded machine); the next study or bench measures it again."""
    device = _indexed(device)
    key = _cache_key(device, _device_name(device), matmul_dtype(device, dtype))
    path = _cache_path()
    entries = _read_cache(path)
    if entries.pop(key, None) is not None:
        _write_cache(path, entries)



_here = False  # see calibrate_here


def calibrate_here() -> None:
    """Declare this process a short-lived one that ends before any trial starts (the
    rank server's fork that prepares one plan, harness.launch.rank_server.ask): a
    calibration that misses the cache then runs here, as it would in its own process,
    instead of in a new interpreter that imports torch again (a second or more)."""
    global _here
    _here = True


def _measure_in_subprocess(device: torch.device, dtypes: list[str]) -> dict[str, Peak]:
    """`_measure` of each dtype in one short-lived process (harness.measure.calibrate),
    so that the CUDA context the matmuls need ends with it instead of staying here."""
    root = str(Path(__file__).resolve().parents[2])  # where `harness` imports from
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "harness.measure.calibrate", str(device), *dtypes]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=CALIBRATION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"calibration matmul on {device} ran past "
                           f"{CALIBRATION_TIMEOUT_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"calibration matmul on {device} failed (exit {done.returncode}): "
                           f"{tail}")
    answer = json.loads(lines[-1])
    peaks = {d: _valid_entry(answer.get(d)) for d in dtypes}
    if any(p is None for p in peaks.values()):
        raise RuntimeError(f"calibration on {device} answered {lines[-1]!r}")
    return peaks
