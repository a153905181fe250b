"""Sampling a GPU through NVML while a trial runs: memory used, power, utilisation, energy.

    with NvmlSampler(device) as sampler:
        ...                       # the timed steps
    reading = sampler.reading()   # NvmlReading, or None where NVML is absent

NVML is absent on the CPU, without the `pynvml` module (package `nvidia-ml-py`),
without an NVIDIA driver, and where the CUDA device cannot be matched to an NVML
device. Then nothing starts and `reading()` is None; nothing raises.

NVML numbers devices its own way and ignores CUDA_VISIBLE_DEVICES, so the CUDA
device is matched to its NVML handle by UUID. NVML's memory figure is the whole
device's, every process on it included.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

DEFAULT_INTERVAL_S = 0.05
T = TypeVar("T")


@dataclass(frozen=True)
class NvmlReading:
    memory_used_peak_bytes: int | None  # the largest device memory used seen
    power_mean_w: float | None
    utilization_mean_pct: float | None  # share of time a kernel ran, as NVML counts it
    energy_j: float | None  # energy counter difference, else power integrated over time
    samples: int
    duration_s: float
    memory_used_base_bytes: int | None = None  # device memory used when sampling started
    energy_source: str | None = None  # "energy counter" / "power integrated" / None
    error: str | None = None  # what stopped the sampling thread early, if anything
    process_used_peak_bytes: int | None = None  # the most this process held on the device


def _norm_uuid(uuid: Any) -> str:
    """Hex digits of a UUID, whatever its form: "GPU-xxxxxxxx-...", "xxxxxxxx-...", 16 bytes."""
    if isinstance(uuid, bytes | bytearray):
        text = uuid.hex() if len(uuid) == 16 else uuid.decode("ascii", "replace")
    else:
        text = str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return re.sub(r"[^0-9a-f]", "", text)


def _cuda_uuid(device: torch.device) -> str | None:
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except Exception:  # no CUDA, or a torch without uuid
        return None
    return _norm_uuid(uuid) if uuid is not None else None


def nvml_handle(pynvml: Any, device: torch.device) -> Any | None:
    """The NVML handle of CUDA `device` (NVML must be initialised), or None."""
    want = _cuda_uuid(device)
    if not want:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return None
    for i in range(count):
        with contextlib.suppress(pynvml.NVMLError):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            if _norm_uuid(pynvml.nvmlDeviceGetUUID(handle)) == want:
                return handle
    # A MIG instance: torch reports the instance's UUID, which is no top-level device.
    dashed = f"{want[:8]}-{want[8:12]}-{want[12:16]}-{want[16:20]}-{want[20:]}"
    for prefix in ("MIG-", "GPU-"):
        with contextlib.suppress(pynvml.NVMLError):
            return pynvml.nvmlDeviceGetHandleByUUID(prefix + dashed)
    return None


class NvmlSampler:
    """Samples one CUDA device's memory used, power and utilisation every `interval_s`."""

    def __init__(self, device: torch.device, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.device = device
        self.interval_s = interval_s
        self.unavailable: str | None = None  # why NVML is absent, in words
        self._nvml: Any = None
        self._handle: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._samples: list[tuple[float, int | None, float | None, float | None]] = []
        self._unsupported: set[str] = set()
        self._error: str | None = None
        self._t0 = self._t1 = 0.0
        self._energy0: int | None = None
        self._energy1: int | None = None
        self._base_memory: int | None = None
        self._process_peak: int | None = None

    # --- life cycle ------------------------------------------------------------------

    @property
    def available(self) -> bool:
        return self._handle is not None

    def start(self) -> NvmlSampler:
        if self._thread is not None or self.unavailable is not None:
            return self
        if self.device.type != "cuda":
            self.unavailable = f"no NVML on a {self.device.type} device"
            return self
        try:
            import pynvml
        except ImportError:
            self.unavailable = "pynvml is not installed (package nvidia-ml-py)"
            return self
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError, or a missing library (OSError)
            self.unavailable = f"NVML did not start: {e}"
            return self
        try:
            handle = nvml_handle(pynvml, self.device)
        except Exception:
            handle = None
        if handle is None:
            self.unavailable = f"no NVML device has the UUID of {self.device}"
            _shutdown(pynvml)
            return self
        self._nvml, self._handle = pynvml, handle
        self._t0 = time.perf_counter()
        self._guarded(self._first_sample)
        self._thread = threading.Thread(target=self._guarded, args=(self._loop,),
                                        name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=max(2.0, 10 * self.interval_s))
        self._t1 = time.perf_counter()
        self._guarded(self._last_sample)
        _shutdown(self._nvml)

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- sampling ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _guarded(self, fn: Any) -> None:
        """Run `fn`; an exception is recorded (the first one), never raised into the trial."""
        try:
            fn()
        except Exception as e:
            if self._error is None:
                self._error = f"{type(e).__name__}: {e}"

    def _first_sample(self) -> None:
        self._energy0 = self._energy()
        self._sample()
        self._base_memory = self._samples[0][1]

    def _last_sample(self) -> None:
        self._sample()
        self._energy1 = self._energy()

    def _query(self, what: str, fn: Any) -> Any:
        if what in self._unsupported:
            return None
        try:
            return fn()
        except AttributeError:  # a pynvml too old for this query
            self._unsupported.add(what)
            return None
        except self._nvml.NVMLError as e:
            if isinstance(e, self._nvml.NVMLError_NotSupported | self._nvml.NVMLError_NoPermission):
                self._unsupported.add(what)
            return None

    def _sample(self) -> None:
        nv, h = self._nvml, self._handle
        memory = self._query("memory", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used))
        power = self._query("power", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        util = self._query("utilization", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
        mine = self._query("process", lambda: _process_used(nv, h, os.getpid()))
        with self._lock:
            self._samples.append((time.perf_counter(), memory, power, util))
            if mine is not None:
                self._process_peak = max(self._process_peak or 0, mine)

    def _energy(self) -> int | None:
        """The device's energy counter in millijoules (Volta and later), or None."""
        nv, h = self._nvml, self._handle
        return self._query("energy", lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(h)))

    # --- the result ---------------------------------------------------------------------

    def reading(self) -> NvmlReading | None:
        """What was sampled (so far, if still running); None where NVML is absent."""
        if self._handle is None:
            return None
        with self._lock:
            samples = list(self._samples)
        end = self._t1 if self._stop.is_set() and self._t1 else time.perf_counter()
        memory = [m for _, m, _, _ in samples if m is not None]
        power = [(t, p) for t, _, p, _ in samples if p is not None]
        util = [u for _, _, _, u in samples if u is not None]

        energy, energy_source, e0, e1 = None, None, self._energy0, self._energy1
        if e0 is not None and e1 is not None and e1 > e0:
            energy, energy_source = (e1 - e0) / 1000.0, "energy counter"
        elif len(power) >= 2:  # trapezoids between the power samples
            pairs = zip(power[:-1], power[1:], strict=True)
            energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in pairs)
            energy_source = "power integrated"
        return NvmlReading(
            memory_used_peak_bytes=max(memory) if memory else None,
            power_mean_w=sum(p for _, p in power) / len(power) if power else None,
            utilization_mean_pct=sum(util) / len(util) if util else None,
            energy_j=energy,
            samples=len(samples),
            duration_s=end - self._t0,
            memory_used_base_bytes=self._base_memory,
            energy_source=energy_source,
            error=self._error,
            process_used_peak_bytes=self._process_peak,
        )


def _shutdown(pynvml: Any) -> None:
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()


def _process_used(nv: Any, handle: Any, pid: int) -> int | None:
    """Device memory NVML counts for process `pid` on `handle`, or None (not listed)."""
    for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        used = getattr(proc, "usedGpuMemory", None)
        if proc.pid == pid and isinstance(used, int):
            return used
    return None


def _ask(query: Callable[[Any], T], default: T) -> T:
    """One question to NVML, started and shut down around it: `query(pynvml)`, or
    `default` where NVML is absent or the question fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return default
    try:
        return query(pynvml)
    except Exception:
        return default
    finally:
        _shutdown(pynvml)


def ask_device(device: torch.device, query: Callable[[Any, Any], T]) -> T | None:
    """`query(pynvml, handle)` of CUDA `device`, as `_ask`; None on a CPU, where NVML is
    absent or the question fails, or where no NVML device matches."""
    if device.type != "cuda":
        return None

    def ask(nv: Any) -> T | None:
        handle = nvml_handle(nv, device)
        return None if handle is None else query(nv, handle)

    return _ask(ask, None)


def process_memory_bytes(device: torch.device) -> int | None:
    """What the device holds for this process now, through NVML; None where NVML or the
    per-process figure is unavailable (a CPU, no driver, a container's own PIDs)."""
    return ask_device(device, lambda nv, handle: _process_used(nv, handle, os.getpid()))


def gpu_identity(device: torch.device) -> str:
    """"uuid <hex> sm-max <MHz>" for CUDA `device`, what of it can be read ("" if none):
    two cards of one name, or one card under another clock cap, differ here."""
    uuid = _cuda_uuid(device)

    def sm_max(nv: Any, handle: Any) -> str:
        return f"sm-max {int(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM))}"

    parts = [f"uuid {uuid}" if uuid else None, ask_device(device, sm_max)]
    return " ".join(p for p in parts if p)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version() -> str | None:
    """The NVIDIA driver version via NVML, or None."""
    return _ask(lambda nv: _text(nv.nvmlSystemGetDriverVersion()), None)


def gpu_names() -> list[str]:
    """Names of all GPUs NVML sees (all of the host's, whatever CUDA_VISIBLE_DEVICES says)."""
    return _ask(lambda nv: [_text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i)))
                            for i in range(nv.nvmlDeviceGetCount())], [])


def compute_processes(device: torch.device) -> list[dict[str, Any]] | None:
    """The compute processes NVML lists on CUDA `device` now ({"pid", "used_memory_bytes"}),
    or None where NVML cannot say (a CPU, no driver, no matching device)."""
    return ask_device(device, lambda nv, handle: [
        {"pid": p.pid, "used_memory_bytes": getattr(p, "usedGpuMemory", None)}
        for p in nv.nvmlDeviceGetComputeRunningProcesses(handle)])
