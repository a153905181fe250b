"""Peak FLOP/s: the datasheet, the calibration matmul and its cache, the figure MFU uses."""

from __future__ import annotations

import json
import math

import pytest
import torch

from training_harness.core.errors import HarnessError
from training_harness.core.gpus import GPUS
from training_harness.measure import peaks
from training_harness.measure.env import capture_env
from training_harness.measure.peaks import (
    Peak,
    autocast_dtype_name,
    datasheet_peak,
    matmul_dtype,
    measured_peak,
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
    for row in GPUS:
        assert set(row.flops) <= {*peaks.DTYPES, "fp8"}, row.label
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
    """Counts the calibrations (each a process of its own: training_harness.measure.calibrate)."""
    calls = []
    real = peaks._measure_in_subprocess

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(peaks, "_measure_in_subprocess", counting)
    return calls


@pytest.fixture
def stand_in(monkeypatch):
    """A calibration that starts no process (each real one is a new interpreter importing
    torch, ~2 CPU-s): the real one is test_measured_peak_cpu_is_positive_and_cached's and
    test_the_calibration_process_answers_every_dtype_asked's. Lists the dtypes asked."""
    calls = []

    def calibration(device, dtypes):
        calls.append(dtypes)
        return {d: Peak(1e9 * len(calls), f"measured: stand-in {d} matmul") for d in dtypes}

    monkeypatch.setattr(peaks, "_measure_in_subprocess", calibration)
    return calls


def test_measured_peak_cpu_is_positive_and_cached(cache_dir, counted) -> None:
    """The real calibration (training_harness.measure.calibrate, a process of its own), asked for
    two
    dtypes at once: both answered by one process, both cached, the cache then read. (The
    protocol's own test, test_the_calibration_process_answers_every_dtype_asked, started
    a second process for this: it is this test now.)"""
    found = peaks.measured_peaks(CPU, ["fp32", "bf16"])
    assert set(found) == {"fp32", "bf16"} and len(counted) == 1  # one process for both
    first = found["fp32"]
    assert math.isfinite(first.flops) and first.flops > 1e8  # any CPU does 0.1 GFLOP/s
    assert first.source.startswith("measured: ") and "fp32 matmul" in first.source
    bf16 = found["bf16"]
    assert math.isfinite(bf16.flops) and bf16.flops > 0 and bf16.source.startswith("measured: ")

    data = json.loads((cache_dir / "peaks.json").read_text())
    assert len(data["entries"]) == 2
    entry = data["entries"][peaks.peak_key(CPU, peaks.device_name(CPU), "fp32")]
    assert entry["flops"] == first.flops and entry["source"] == first.source

    counted.clear()
    second = measured_peak(CPU, "fp32")
    assert second == first
    assert counted == [], "the second call reads the cache"

    # no leftover temporary files from the atomic write
    assert sorted(p.name for p in cache_dir.iterdir()) == ["peaks.json"]


def test_measured_peak_uses_a_planted_cache_entry(cache_dir, counted) -> None:
    key = peaks.peak_key(CPU, peaks.device_name(CPU), "bf16")
    (cache_dir / "peaks.json").write_text(
        json.dumps({"version": 1, "entries": {key: {"flops": 1.5e12, "source": "measured: x"}}})
    )
    assert measured_peak(CPU, "bf16") == Peak(1.5e12, "measured: x")
    assert counted == []


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 1, "entries": 3}', ""])
def test_corrupt_cache_is_ignored_and_rewritten(cache_dir, stand_in, content) -> None:
    (cache_dir / "peaks.json").write_text(content)
    peak = measured_peak(CPU, "fp32")
    assert peak.flops > 0 and stand_in == [["fp32"]]
    data = json.loads((cache_dir / "peaks.json").read_text())
    assert data["version"] == 1 and len(data["entries"]) == 1


def test_cache_false_always_measures(cache_dir, stand_in) -> None:
    """Each call asks for a calibration and none is stored."""
    assert measured_peak(CPU, "fp32", cache=False).flops == 1e9
    assert measured_peak(CPU, "fp32", cache=False).flops == 2e9
    assert stand_in == [["fp32"], ["fp32"]]
    assert not (cache_dir / "peaks.json").exists()


def test_peaks_for_cpu_uses_the_measured_peak(cache_dir, stand_in) -> None:
    choice = peaks_for(CPU, "AMD EPYC 9654", "fp32")
    assert choice.datasheet is None and stand_in == [["fp32"]]
    assert choice.used is choice.measured and choice.measured.flops == 1e9
    record = choice.as_record()
    json.dumps(record)
    assert record["used"] == "measured" and record["flops"] == choice.measured.flops


def test_peaks_for_prefers_the_datasheet_unless_measured_beats_it(cache_dir, monkeypatch) -> None:
    # exercise the choice without a GPU: pretend the device is an A100
    fake = torch.device("cuda", 0)
    monkeypatch.setattr(peaks, "matmul_dtype", lambda device, dtype, conv=False: dtype)
    monkeypatch.setattr(
        peaks, "measured_peak", lambda *a, **k: Peak(250e12, "measured: fake")
    )
    choice = peaks_for(fake, "NVIDIA A100-SXM4-80GB", "bf16")
    assert choice.used is choice.datasheet and choice.used.flops == 312e12
    assert choice.as_record()["used"] == "datasheet"

    monkeypatch.setattr(
        peaks, "measured_peak", lambda *a, **k: Peak(400e12, "measured: fake")
    )
    choice = peaks_for(fake, "NVIDIA A100-SXM4-80GB", "bf16")
    assert choice.used is choice.measured and "above the datasheet" in choice.reason


def test_fp32_convolutions_take_the_tf32_peak(cache_dir, monkeypatch) -> None:
    """cuDNN runs fp32 convolutions on TF32 tensor cores by default (matmuls not): a
    model with convolutions is measured against the TF32 peak, so MFU stays below 1."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(peaks, "_cuda_fp32_uses_tf32", lambda: (False, "fp32_precision=ieee"))
    monkeypatch.setattr(peaks, "_cuda_conv_uses_tf32", lambda: (True, "cudnn.allow_tf32=True"))
    assert matmul_dtype(cuda, "fp32") == "fp32"
    assert matmul_dtype(cuda, "fp32", convolutions=True) == "tf32"
    assert matmul_dtype(cuda, "bf16", convolutions=True) == "bf16"
    monkeypatch.setattr(
        peaks, "measured_peak", lambda device, dtype, **k: Peak(4e14, f"measured {dtype}")
    )
    choice = peaks_for(cuda, "NVIDIA H100 80GB HBM3", "fp32", convolutions=True)
    assert choice.dtype == "tf32" and choice.used.flops == 494.7e12
    assert choice.measured.source == "measured tf32"
    assert "convolution cudnn.allow_tf32=True" in choice.reason
    monkeypatch.setattr(peaks, "_cuda_conv_uses_tf32", lambda: (False, "cudnn.allow_tf32=False"))
    assert peaks_for(cuda, "NVIDIA H100 80GB HBM3", "fp32", convolutions=True).dtype == "fp32"


# --- on a GPU ---------------------------------------------------------------------------


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


# test_the_calibration_process_answers_every_dtype_asked: its check (one calibration
# process answers every dtype asked, on the CPU) is test_measured_peak_cpu_is_positive_and_cached.


def test_the_cpu_peak_cache_is_keyed_by_instruction_set(monkeypatch) -> None:
    """One CPU model name comes with AVX2 on one day and AVX-512 BF16 on the next (seen
    here): the measured peak of one must not stand for the other. Both instruction sets
    are faked, so the test holds whatever this machine's CPU has."""
    from training_harness.core import device

    def key_on(capability: str, flags: list[str]) -> str:
        monkeypatch.setattr(device, "cpu_capability", lambda: capability)
        monkeypatch.setattr(device, "cpu_flags", lambda: flags)
        return peaks.peak_key(CPU, "AMD EPYC", "bf16")

    avx512 = key_on("AVX512", ["avx2", "avx512f", "avx512_bf16"])
    avx2 = key_on("AVX2", ["avx2"])
    assert avx2 != avx512
    assert "AVX2" in avx2 and "AVX512" in avx512 and "avx512_bf16" in avx512
    # the flags alone tell them apart too (torch may name both "AVX2", e.g. ATEN_CPU_CAPABILITY)
    assert key_on("AVX2", ["avx2", "avx512f", "avx512_bf16"]) != avx2
