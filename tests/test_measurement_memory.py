"""Device readings: NVML sampling (a fake pynvml on the CPU) and peak memory."""

from __future__ import annotations

import os
import sys
import threading
import types

import pytest
import torch

from training_harness.measure import memory, nvml
from training_harness.measure.memory import MemoryTracker, peak_memory_bytes
from training_harness.measure.nvml import NvmlReading, NvmlSampler

CPU = torch.device("cpu")
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --- NVML ------------------------------------------------------------------------------


def test_nvml_sampler_on_cpu_is_absent_and_starts_no_thread() -> None:
    before = threading.active_count()
    with NvmlSampler(CPU) as sampler:
        assert threading.active_count() == before
        assert not sampler.available
    assert sampler.reading() is None
    assert sampler.unavailable


def test_nvml_sampler_without_a_driver_is_absent(monkeypatch) -> None:
    fake = _fake_pynvml(init_fails=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_cuda_uuid", lambda device: "ab" * 16)
    before = threading.active_count()
    with NvmlSampler(torch.device("cuda", 0)) as sampler:
        assert threading.active_count() == before
    assert sampler.reading() is None and "NVML did not start" in sampler.unavailable


@pytest.mark.parametrize("energy_counter", [True, False])
def test_nvml_sampler_with_a_fake_nvml(monkeypatch, energy_counter) -> None:
    fake = _fake_pynvml(energy_counter=energy_counter)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # torch's form of the second device's UUID (no "GPU-" prefix, other case)
    monkeypatch.setattr(nvml, "_cuda_uuid", lambda d: nvml._norm_uuid(fake.UUIDS[1][4:].upper()))
    with NvmlSampler(torch.device("cuda", 0), interval_s=0.01) as sampler:
        assert sampler.available
        deadline = 200
        while len(sampler._samples) < 5 and deadline:
            threading.Event().wait(0.01)
            deadline -= 1
    reading = sampler.reading()
    assert isinstance(reading, NvmlReading)
    assert reading.samples >= 5 and reading.error is None
    assert reading.memory_used_peak_bytes == 2_000 * 2**20  # the second device's
    assert reading.process_used_peak_bytes == 700 * 2**20  # this process's share only
    assert reading.power_mean_w == pytest.approx(300.0)
    assert reading.utilization_mean_pct == pytest.approx(90.0)
    if energy_counter:
        assert reading.energy_source == "energy counter" and reading.energy_j == pytest.approx(5.0)
    else:
        assert reading.energy_source == "power integrated"
        assert reading.energy_j == pytest.approx(300.0 * reading.duration_s, rel=0.2)
    assert not sampler._thread.is_alive()
    assert fake.inits == fake.shutdowns == 1


def test_nvml_sampler_thread_errors_are_captured(monkeypatch) -> None:
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_cuda_uuid", lambda d: nvml._norm_uuid(fake.UUIDS[0]))
    with NvmlSampler(torch.device("cuda", 0), interval_s=0.01) as sampler:
        fake.broken = True  # the next sample raises something that is no NVMLError
        threading.Event().wait(0.1)
    reading = sampler.reading()
    assert reading is not None and "RuntimeError" in reading.error


def test_nvml_no_matching_uuid_is_absent(monkeypatch) -> None:
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "_cuda_uuid", lambda d: "00" * 16)
    with NvmlSampler(torch.device("cuda", 0)) as sampler:
        pass
    assert sampler.reading() is None and "UUID" in sampler.unavailable
    assert fake.inits == fake.shutdowns == 1


def test_norm_uuid_forms() -> None:
    want = "1a2b3c4daaaabbbbcccc0123456789ab"
    assert nvml._norm_uuid("GPU-1a2b3c4d-aaaa-bbbb-cccc-0123456789ab") == want
    assert nvml._norm_uuid("1A2B3C4D-AAAA-BBBB-CCCC-0123456789AB") == want
    assert nvml._norm_uuid(b"GPU-1a2b3c4d-aaaa-bbbb-cccc-0123456789ab") == want
    assert nvml._norm_uuid(bytes.fromhex(want)) == want


def _fake_pynvml(*, init_fails=False, energy_counter=True) -> types.ModuleType:
    """A stand-in for pynvml with two devices (NVML's order, not CUDA's)."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # noqa: N801 — pynvml's name
        pass

    class NVMLError_NoPermission(NVMLError):  # noqa: N801
        pass

    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = NVMLError_NotSupported
    m.NVMLError_NoPermission = NVMLError_NoPermission
    m.UUIDS = [
        "GPU-11111111-2222-3333-4444-555555555555",
        "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
    ]
    m.inits = m.shutdowns = 0
    m.broken = False
    energy = {0: 1_000_000, 1: 1_000_000}

    def nvmlInit():
        if init_fails:
            raise NVMLError("Driver Not Loaded")
        m.inits += 1

    def nvmlShutdown():
        m.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(uuid):
        raise NVMLError("Not Found")

    def nvmlDeviceGetMemoryInfo(h):
        if m.broken:
            raise RuntimeError("boom")
        return types.SimpleNamespace(used=(1_000 + 1_000 * h) * 2**20)

    def nvmlDeviceGetTotalEnergyConsumption(h):
        if not energy_counter:
            raise NVMLError_NotSupported("Not Supported")
        value = energy[h]
        energy[h] += 5_000  # mJ: the start and stop reads differ by 5 J
        return value

    m.nvmlInit = nvmlInit
    m.nvmlShutdown = nvmlShutdown
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: m.UUIDS[h]
    m.nvmlDeviceGetHandleByUUID = nvmlDeviceGetHandleByUUID
    m.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo
    m.nvmlDeviceGetPowerUsage = lambda h: 300_000  # mW
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90)
    m.nvmlDeviceGetTotalEnergyConsumption = nvmlDeviceGetTotalEnergyConsumption
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # this process holds 700 MiB
        types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=9 * 2**30),
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=700 * 2**20)]
    return m


# --- memory ----------------------------------------------------------------------------


def test_the_peak_on_a_gpu_is_what_the_device_held() -> None:
    """The budget's figure: NVML's per-process bytes where known, else the allocator's
    reserved pool, never the allocated tensors alone (which fit where the device OOMs)."""
    gib = 2**30
    held = {"allocated": 57 * gib, "reserved": 76 * gib, "device_held": 77 * gib}
    assert peak_memory_bytes(held) == 77 * gib
    assert peak_memory_bytes({**held, "device_held": None}) == 76 * gib
    assert peak_memory_bytes({"allocated": 5, "reserved": None, "rss": 9}) == 5
    assert peak_memory_bytes({"allocated": None, "reserved": None, "rss": 9}) == 9


def test_memory_tracker_cpu_sees_a_freed_200mb_tensor() -> None:
    tracker = MemoryTracker(CPU)
    tracker.begin()
    x = torch.ones(50 * 2**20)  # 200 MiB, written so the pages are resident
    del x
    d = tracker.end()
    assert d["allocated"] is None and d["reserved"] is None
    assert d["rss_base"] and d["rss"]
    if d["rss_source"].startswith("VmHWM since begin"):
        assert d["rss"] - d["rss_base"] >= 150e6
    else:  # peak over the process lifetime: at least as large
        assert d["rss"] >= 150e6
    assert peak_memory_bytes(d) == d["rss"]


def test_memory_tracker_reset_lowers_the_peak() -> None:
    if not memory._reset_peak_rss():
        pytest.skip("this kernel refuses resetting the peak RSS")
    big = torch.ones(50 * 2**20)
    del big
    tracker = MemoryTracker(CPU)
    tracker.begin()
    d = tracker.end()
    assert d["rss"] - d["rss_base"] < 100e6  # the earlier 200 MiB peak is forgotten


def test_peak_memory_bytes_prefers_the_allocator() -> None:
    assert peak_memory_bytes({"allocated": 10, "rss": 99}) == 10
    assert peak_memory_bytes({"allocated": None, "rss": 99}) == 99
    assert peak_memory_bytes({"allocated": None, "rss": None}) is None


# --- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@no_cuda
def test_gpu_nvml_sampler_and_memory_tracker() -> None:
    device = torch.device("cuda", 0)
    tracker = MemoryTracker(device)
    with NvmlSampler(device, interval_s=0.02) as sampler:
        tracker.begin()
        a = torch.randn(4096, 4096, device=device)
        for _ in range(50):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize(device)
        del a
        d = tracker.end()
    assert d["allocated"] >= 4096 * 4096 * 4 and d["reserved"] >= d["allocated"]
    assert d["reserved"] == torch.cuda.max_memory_reserved(device)
    assert peak_memory_bytes(d) == d["device_held"]
    if d["device_held_source"].startswith("NVML"):  # the context on top of the pool
        assert d["device_held"] > d["reserved"]
        assert 0 < d["device_base"] < d["device_held"]
    else:
        assert d["device_held"] == d["reserved"]
    reading = sampler.reading()
    if reading is None:
        pytest.skip(f"NVML absent: {sampler.unavailable}")
    assert reading.error is None and reading.samples >= 2
    assert reading.memory_used_peak_bytes >= d["reserved"]
    if reading.process_used_peak_bytes is not None:
        assert reading.process_used_peak_bytes >= d["reserved"]
    assert reading.power_mean_w is None or reading.power_mean_w > 0
