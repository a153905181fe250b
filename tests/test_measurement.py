"""Measurement helpers: peak FLOP/s, NVML sampling, peak memory, the environment record."""

from __future__ import annotations

import json
import math
import sys
import threading
import types

import pytest
import torch

from harness.core.errors import HarnessError
from harness.measure import memory, nvml, peak_calibration, peaks
from harness.measure.env import capture_env
from harness.measure.memory import MemoryTracker, peak_memory_bytes
from harness.measure.nvml import NvmlReading, NvmlSampler
from harness.measure.peak_calibration import measured_peak
from harness.measure.peaks import (
    Peak,
    autocast_dtype_name,
    datasheet_peak,
    matmul_dtype,
    peaks_for,
)

CPU = torch.device("cpu")
no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# --- datasheet ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype", "flops", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9e12, "H100 SXM"),
        ("NVIDIA H100 PCIe", "bf16", 756.5e12, "H100 PCIe"),
        ("NVIDIA H100 NVL", "bf16", 835.5e12, "H100 NVL"),
        ("NVIDIA H200", "bf16", 989.4e12, "H200 SXM"),
        ("NVIDIA H200 NVL", "bf16", 835.5e12, "H200 NVL"),
        ("NVIDIA GH200 480GB", "bf16", 989.4e12, "GH200"),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12, "A100 SXM"),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156e12, "A100 SXM"),
        ("NVIDIA A100-PCIE-40GB", "fp32", 19.5e12, "A100 PCIe"),
        ("NVIDIA A100 80GB PCIe", "fp16", 312e12, "A100 PCIe"),
        ("NVIDIA A10G", "bf16", 70e12, "A10G"),
        ("NVIDIA A10", "bf16", 125e12, "A10"),
        ("NVIDIA L4", "bf16", 121e12, "L4"),
        ("NVIDIA L40S", "bf16", 362.05e12, "L40S"),
        ("Tesla V100-SXM2-32GB", "fp16", 125e12, "V100 SXM2"),
        ("Tesla T4", "fp16", 65e12, "T4"),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2e12, "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "fp16", 71e12, "RTX 3090"),
        ("NVIDIA B200", "bf16", 2.25e15, "B200"),
        ("AMD Instinct MI300X", "bf16", 1307.4e12, "MI300X"),
        ("AMD Instinct MI250X", "fp16", 191.5e12, "MI250X"),
    ],
)
def test_datasheet_lookup(name: str, dtype: str, flops: float, label: str) -> None:
    peak = datasheet_peak(name, dtype)
    assert peak is not None
    assert peak.flops == pytest.approx(flops)
    assert peak.source.startswith("datasheet: ") and f"{dtype} dense" in peak.source
    assert label in peak.source


def test_datasheet_pcie_and_nvl_are_not_the_sxm_row() -> None:
    sxm = datasheet_peak("NVIDIA H100 80GB HBM3", "bf16")
    pcie = datasheet_peak("NVIDIA H100 PCIe", "bf16")
    nvl = datasheet_peak("NVIDIA H100 NVL", "bf16")
    assert sxm and pcie and nvl
    assert "SXM" in sxm.source and "PCIe" in pcie.source and "NVL" in nvl.source
    assert pcie.flops < nvl.flops < sxm.flops


def test_datasheet_near_names_do_not_collide() -> None:
    # GH200 is not H200, A100 is not A10, L40S is not L4, 3090 Ti is not 3090
    assert "GH200" in datasheet_peak("NVIDIA GH200 480GB", "bf16").source
    assert "A100" in datasheet_peak("NVIDIA A100-SXM4-40GB", "bf16").source
    assert datasheet_peak("NVIDIA A10", "bf16").source == "datasheet: NVIDIA A10 bf16 dense"
    assert "L40S" in datasheet_peak("NVIDIA L40S", "bf16").source
    assert "3090 Ti" in datasheet_peak("NVIDIA GeForce RTX 3090 Ti", "bf16").source


def test_datasheet_unknown_is_none() -> None:
    assert datasheet_peak("AMD EPYC 9654 96-Core Processor", "fp32") is None
    assert datasheet_peak("NVIDIA GeForce GTX 1080", "fp32") is None
    assert datasheet_peak("NVIDIA GeForce RTX 4090 D", "bf16") is None
    assert datasheet_peak("Tesla T4", "bf16") is None  # no bf16 tensor cores
    with pytest.raises(ValueError):
        datasheet_peak("NVIDIA H100 PCIe", "int8")


def test_every_row_is_dense_and_sane() -> None:
    # a row typed with the sparse figure, or in TFLOP/s instead of FLOP/s, shows here
    for row in peaks._DATASHEET:
        assert set(row.flops) <= set(peaks.DTYPES), row.label
        for dtype, flops in row.flops.items():
            assert 1e12 <= flops <= 5e15, (row.label, dtype)
        if "bf16" in row.flops and "tf32" in row.flops:
            assert row.flops["bf16"] == pytest.approx(2 * row.flops["tf32"], rel=0.25), row.label


def test_autocast_dtype_name() -> None:
    assert autocast_dtype_name({}) == "fp32"
    assert autocast_dtype_name({"checkpoint": {}}) == "fp32"
    assert autocast_dtype_name({"amp": {}}) == "bf16"
    assert autocast_dtype_name({"amp": {"dtype": "fp16"}}) == "fp16"
    assert autocast_dtype_name({"amp": {"dtype": "bfloat16"}}) == "bf16"
    with pytest.raises(HarnessError):
        autocast_dtype_name({"amp": {"dtype": "fp8"}})


def test_matmul_dtype_on_cpu_is_unchanged() -> None:
    for dtype in ("fp32", "bf16", "fp16", "tf32"):
        assert matmul_dtype(CPU, dtype) == dtype


# --- measured peak ---------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def counted(monkeypatch):
    """Counts calls of the calibration benchmark (and keeps it short)."""
    monkeypatch.setattr(peak_calibration, "CPU_MIN_TIME_S", 0.05)
    calls = []
    real = peak_calibration._benchmark_matmul

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(peak_calibration, "_benchmark_matmul", counting)
    return calls


def test_measured_peak_cpu_is_positive_and_cached(cache_dir, counted) -> None:
    first = measured_peak(CPU, "fp32")
    assert math.isfinite(first.flops) and first.flops > 1e8  # any CPU does 0.1 GFLOP/s
    assert first.source.startswith("measured: ") and "fp32 matmul" in first.source
    assert counted, "the first call measures"

    data = json.loads((cache_dir / "peaks.json").read_text())
    (entry,) = data["entries"].values()
    assert entry["flops"] == first.flops and entry["source"] == first.source

    counted.clear()
    second = measured_peak(CPU, "fp32")
    assert second == first
    assert counted == [], "the second call reads the cache"

    # no leftover temporary files from the atomic write
    assert sorted(p.name for p in cache_dir.iterdir()) == ["peaks.json"]


def test_measured_peak_uses_a_planted_cache_entry(cache_dir, counted) -> None:
    key = peak_calibration._cache_key(CPU, peak_calibration._device_name(CPU), "bf16")
    (cache_dir / "peaks.json").write_text(
        json.dumps({"version": 1, "entries": {key: {"flops": 1.5e12, "source": "measured: x"}}})
    )
    assert measured_peak(CPU, "bf16") == Peak(1.5e12, "measured: x")
    assert counted == []


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 1, "entries": 3}', ""])
def test_corrupt_cache_is_ignored_and_rewritten(cache_dir, counted, content) -> None:
    (cache_dir / "peaks.json").write_text(content)
    peak = measured_peak(CPU, "fp32")
    assert peak.flops > 0 and counted
    data = json.loads((cache_dir / "peaks.json").read_text())
    assert data["version"] == 1 and len(data["entries"]) == 1


def test_cache_false_always_measures(cache_dir, counted) -> None:
    measured_peak(CPU, "fp32", cache=False)
    n = len(counted)
    measured_peak(CPU, "fp32", cache=False)
    assert len(counted) > n
    assert not (cache_dir / "peaks.json").exists()


def test_peaks_for_cpu_uses_the_measured_peak(cache_dir) -> None:
    choice = peaks_for(CPU, "AMD EPYC 9654", "fp32")
    assert choice.datasheet is None
    assert choice.used is choice.measured
    record = choice.as_record()
    json.dumps(record)
    assert record["used"] == "measured" and record["flops"] == choice.measured.flops


def test_peaks_for_prefers_the_datasheet_unless_measured_beats_it(cache_dir, monkeypatch) -> None:
    # exercise the choice without a GPU: pretend the device is an A100
    fake = torch.device("cuda", 0)
    monkeypatch.setattr(peaks, "matmul_dtype", lambda device, dtype: dtype)
    monkeypatch.setattr(
        peak_calibration, "measured_peak", lambda *a, **k: Peak(250e12, "measured: fake")
    )
    choice = peaks_for(fake, "NVIDIA A100-SXM4-80GB", "bf16")
    assert choice.used is choice.datasheet and choice.used.flops == 312e12
    assert choice.as_record()["used"] == "datasheet"

    monkeypatch.setattr(
        peak_calibration, "measured_peak", lambda *a, **k: Peak(400e12, "measured: fake")
    )
    choice = peaks_for(fake, "NVIDIA A100-SXM4-80GB", "bf16")
    assert choice.used is choice.measured and "above the datasheet" in choice.reason


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
    return m


# --- memory ----------------------------------------------------------------------------


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


# --- environment -----------------------------------------------------------------------


def test_capture_env_is_json_and_has_versions(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("TORCH_HUB_TOKEN", "do-not-record")
    env = capture_env(CPU)
    text = json.dumps(env)
    assert env["torch"] == torch.__version__
    assert env["python"].count(".") == 2
    assert env["cpu_count"] and env["torch_threads"] >= 1
    assert env["env"]["OMP_NUM_THREADS"] == "2"
    assert "TORCH_HUB_TOKEN" not in env["env"] and "do-not-record" not in text
    assert "harness" in env and "git" in env and "driver" in env


def test_capture_env_keeps_storage_passwords_out(monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_STORAGE", "postgresql://tuner:pw-in-env@db/h")
    monkeypatch.setenv("HARNESS_OTHER", "redis://u:pw-in-value@cache:6379/0")
    text = json.dumps(capture_env(CPU))
    assert "pw-in-env" not in text and "HARNESS_STORAGE" not in text
    assert "pw-in-value" not in text and "redis://u:***@cache" in text


def test_capture_env_never_raises(monkeypatch) -> None:
    import harness.measure.env as env_mod

    def boom(*a, **k):
        raise RuntimeError("broken")

    monkeypatch.setattr(env_mod, "_capture", boom)
    env = capture_env(CPU)
    assert "broken" in env["error"]
    json.dumps(env)
    monkeypatch.undo()
    monkeypatch.setattr(env_mod, "git_commit", boom)
    monkeypatch.setattr(env_mod, "_env_vars", boom)
    env = capture_env(CPU)
    assert env["git"] is None and env["env"] == {} and env["torch"] == torch.__version__


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
    assert peak_memory_bytes(d) == d["allocated"]
    reading = sampler.reading()
    if reading is None:
        pytest.skip(f"NVML absent: {sampler.unavailable}")
    assert reading.error is None and reading.samples >= 2
    assert reading.memory_used_peak_bytes >= d["reserved"]
    assert reading.power_mean_w is None or reading.power_mean_w > 0


@pytest.mark.gpu
@no_cuda
def test_gpu_measured_peak_is_near_the_datasheet(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    choice = peaks_for(device, name, "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    assert choice.measured.flops > 0 and "CUDA events" in choice.measured.source
    if choice.datasheet is not None:  # a known device reaches a fair share of its sheet
        assert 0.3 < choice.measured.flops / choice.datasheet.flops < 1.1
    env = capture_env(device)
    assert env["gpu_names"] and env["cuda"] == torch.version.cuda
