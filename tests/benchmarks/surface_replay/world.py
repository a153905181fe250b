"""A simulated H100 machine for the tuner's process: the torch-side helper answered in this
process with a faked CUDA RuntimeEnv, and a virtual clock for training_harness.tune.

    with h100_world(gpus=8):                  # RuntimeEnv, devices, peaks faked (restored after)
        helper = SurfaceHelper(clock)         # TorchHelper: the real study_facts and prepare
        with virtual_time(clock):             # training_harness.tune's time.time/monotonic/sleep
            ...

`SurfaceHelper` runs training_harness.measure.torch_helper_server's own `study_facts` and `prepare`
(the strategy registry, the estimator) in this process, on an "NVIDIA H100 80GB HBM3"
RuntimeEnv with bf16 and Triton, 79.18 GiB per device, the datasheet peaks (the measured
ones of docs/benchmarks/gpu_h100-80gb-hbm3_2026-11-23.md beside them), and a fixed env
record. Its answers are cached per configuration (name and seed aside); each call
costs PREPARE_S on the virtual clock, as the helper's round trip costs the real tuner.
`h100_world(1, H200)` is the H200 of the project's one measured GPU table instead
(table_run.py replays the harness's search on it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time as real_time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.prepared import PreparedPlan
from training_harness.launch.torch_helper import TorchHelper
from training_harness.study.machine_facts import MachineFacts


@dataclass(frozen=True)
class SimulatedGpu:
    """What the simulated machine's GPU reports: its name, its memory, the peaks its
    selftest measured, and the env record its trials carry."""

    name: str
    capacity: int
    measured: dict[str, float]  # FLOP/s by dtype, from the GPU's own selftest page
    measured_on: str  # where the measured peaks come from
    env: dict[str, Any]


H100 = SimulatedGpu("NVIDIA H100 80GB HBM3", int(79.18 * 2**30),
                    {"fp32": 52e12, "tf32": 371e12, "bf16": 715e12, "fp16": 673e12},
                    "H100 selftest 2026-11-23",
                    {"torch": "2.11.0+cu130", "cuda": "13.0", "device": "NVIDIA H100 80GB HBM3",
                     "simulated": True})
# The H200 of docs/benchmarks/gpu_h200_2026-11-27c.md and its table: the memory torch
# reported and the peaks its records carry (fp32 and bf16; the table's study uses no other)
H200 = SimulatedGpu("NVIDIA H200", 150109880320, {"fp32": 51.01e12, "bf16": 713.5e12},
                    "H200 selftest 2026-11-27",
                    {"torch": "2.11.0+cu130", "cuda": "13.0", "device": "NVIDIA H200",
                     "simulated": True})
# Virtual seconds per question to the torch-side helper: measured 11.8 ms wall (7.8 ms
# CPU) per prepare of the 1B GPT's plans in this process on a loaded 2-core EPYC
# (2026-11-27; the model's facts and FLOPs counted once per workload, as the helper
# does), times four for the helper's round trip and a slower login node. It was 0.2 s
# while every prepare built the model on the meta device.
PREPARE_S = 0.05
# What the calibration process would measure beside the tensors (device_overhead): the
# context the H100 page measured (0.51 GiB), and the workspaces the surfaces hold beside
# it (surfaces.hardware.CONTEXT less the context); NCCL not measurable on one rank here.
OVERHEAD_CONTEXT = int(0.51 * 2**30)


class VirtualClock:
    """Seconds since the epoch, advanced only by what the simulation spends."""

    def __init__(self, start: float | None = None):
        self.now = real_time.time() if start is None else start

    def time(self) -> float:
        return self.now

    monotonic = perf_counter = time

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    advance = sleep


def _peaks(gpu: SimulatedGpu) -> dict[str, dict[str, Any]]:
    from training_harness.measure.peaks import Peak, PeakChoice, datasheet_peak

    out = {}
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        if dtype not in gpu.measured:  # not measured on that GPU: a study of it uses none
            continue
        sheet = datasheet_peak(gpu.name, dtype)
        measured = Peak(gpu.measured[dtype], f"measured: 8192x8192 {dtype} matmul "
                                             f"({gpu.measured_on}, replayed)")
        choice = PeakChoice(dtype, sheet, measured, sheet, "the device is in the datasheet table")
        out[dtype] = {**choice.as_record(), "compute_dtype": dtype}
    return out


def _overhead() -> Any:
    from tests.benchmarks.surfaces.hardware import CONTEXT
    from training_harness.core.overhead import DeviceOverhead

    return DeviceOverhead(OVERHEAD_CONTEXT, CONTEXT - OVERHEAD_CONTEXT, 0,
                          "simulated: the H100 page's context, the surface's workspaces")


@contextlib.contextmanager
def h100_world(gpus: int, gpu: SimulatedGpu = H100) -> Iterator[None]:
    """This process's view of the machine: `gpus` of `gpu`, H100s unless told (every patch
    undone on exit)."""
    import torch

    import training_harness.core.device as device
    import training_harness.estimator.facts as model_facts
    import training_harness.measure.memory as memory
    import training_harness.measure.prepare as prepare
    import training_harness.measure.torch_helper_server as server
    import training_harness.strategies.fused as fused

    env = device.RuntimeEnv("cuda", gpu.name, gpus, True, True)
    cuda = torch.device("cuda", 0)  # a device object only: no CUDA call
    patches = [
        (device.RuntimeEnv, "detect", classmethod(lambda cls, requested="auto": env)),
        (device, "resolve_device", lambda requested="auto", local_rank=0: cuda),
        (prepare, "resolve_device", lambda requested="auto", local_rank=0: cuda),
        (memory, "device_memory_bytes", lambda device_type: gpu.capacity),
        (prepare, "study_peaks", lambda device_type, dtypes, workload: _peaks(gpu)),
        (prepare, "device_overhead", lambda device: _overhead()),
        (fused, "triton_unavailable", lambda device_type: None),
        (model_facts.ModelFacts, "of", classmethod(_cached_facts(model_facts.ModelFacts.of))),
    ]
    saved = [(obj, name, obj.__dict__.get(name, getattr(obj, name))) for obj, name, _ in patches]
    cache = server._ENV_CACHE.get("cuda")
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        server._ENV_CACHE["cuda"] = dict(gpu.env)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        if cache is None:
            server._ENV_CACHE.pop("cuda", None)
        else:
            server._ENV_CACHE["cuda"] = cache


def _cached_facts(of: Any) -> Any:
    """ModelFacts.of builds the model on the meta device at every prepare (0.15 s for the
    1.3B GPT): the same workload arguments give the same facts, so once per workload."""
    seen: dict[str, Any] = {}

    def cached(cls: Any, workload: Any, lora: Any = None) -> Any:
        key = f"{type(workload).__qualname__}:{getattr(workload, 'cfg', None)!r}"
        if key.endswith(":None") or lora is not None:
            return of(workload, lora)
        if key not in seen:
            seen[key] = of(workload)
        return seen[key]
    return cached


def _key(plan: Plan) -> str:
    table = plan.to_dict()
    table.pop("name", None)
    table.pop("seed", None)
    return json.dumps(table, sort_keys=True, default=str)


class SurfaceHelper(TorchHelper):
    """The torch-side helper's answers, computed here (inside `h100_world`)."""

    def __init__(self, clock: VirtualClock | None = None):
        super().__init__()
        self.clock = clock
        self.cache: dict[str, PreparedPlan | HarnessError] = {}
        self.calls = 0
        # A what-if (search_replay.py --oracle-gemm): each answer's prediction changed
        # after the estimator, as by a device profile that knew the surface's GEMMs.
        self.adjust: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None

    def devices(self) -> dict[str, Any]:
        from training_harness.core.device import RuntimeEnv

        return {"cuda": RuntimeEnv.detect("cuda").device_count}

    def study_facts(self, study: Any) -> MachineFacts:
        from training_harness.measure.torch_helper_server import study_facts

        facts = MachineFacts.from_json(json.loads(json.dumps(study_facts(study.to_dict()),
                                                             default=str)))
        study.known_good = facts.known_good
        return facts

    def prepare(self, plan: Plan, peaks: dict[str, Any] | None = None,
                phases: dict[str, float] | None = None) -> PreparedPlan:
        from training_harness.measure.torch_helper_server import prepare

        self.calls += 1
        if self.clock is not None:
            self.clock.advance(PREPARE_S)
        k = _key(plan)
        if k not in self.cache:
            try:
                self.cache[k] = PreparedPlan.from_dict(prepare(plan.to_dict(), peaks))
            except HarnessError as e:
                self.cache[k] = e
        got = self.cache[k]
        if isinstance(got, HarnessError):
            raise got
        predicted = got.predicted
        if self.adjust is not None and predicted and predicted.get("step_parts"):
            predicted = self.adjust(got.plan.to_dict(), predicted)
        return dataclasses.replace(got, plan=got.plan.replace(name=plan.name, seed=plan.seed),
                                   predicted=predicted)

    def close(self) -> None:
        pass


def gemm_oracle(a: Any) -> Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]:
    """The estimator's step with its compute at the GEMM efficiency surface `a` gives the
    plan's micro-batch and width (tests/benchmarks/surfaces/hardware.py), in place of one
    MFU for every shape: what a device profile measured on that GPU would tell it of its
    matmuls, and nothing else (attention, element-wise work and compile stay the
    estimator's own). A what-if, to ask whether such a profile would change the search."""
    from tests.benchmarks.surfaces.config import read
    from tests.benchmarks.surfaces.hardware import gemm_efficiency
    from training_harness.estimator.step_costs import COMPUTE_MFU, step_of

    def adjust(plan: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
        c = read(plan)
        p = dict(predicted["step_parts"])
        flops_s = p["compute"] + p["recompute"]
        stretch = (flops_s + p["bubble"]) / flops_s if flops_s else 1.0  # 1 / (1 - bubble)
        f = COMPUTE_MFU / gemm_efficiency(c.dtype, c.micro * c.seq, c.hidden / c.tensor, a)
        p.update(compute=p["compute"] * f, recompute=p["recompute"] * f,
                 bubble=flops_s * f * (stretch - 1))
        return {**predicted, "step_parts": p, "step_time_s": step_of(p)}
    return adjust


class _TimeModule(types.ModuleType):
    """`time` as training_harness.tune sees it: the virtual clock's time, monotonic, perf_counter
    and sleep; everything else the real module's."""

    def __init__(self, clock: VirtualClock):
        super().__init__("time")
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        if name in ("time", "monotonic", "perf_counter", "sleep"):
            return getattr(self._clock, name)
        return getattr(real_time, name)


@contextlib.contextmanager
def virtual_time(clock: VirtualClock, prefixes: tuple[str, ...] = ("training_harness.tune",)
                 ) -> Iterator[list[str]]:
    """Every loaded module under `prefixes` that holds the `time` module (or its time,
    monotonic, sleep) reads `clock` instead, until the block ends. Yields the names
    patched, to say so."""
    import training_harness.tune.search.loop  # noqa: F401  (the search and all it imports, loaded)
    import training_harness.tune.session  # noqa: F401

    fake = _TimeModule(clock)
    swaps = {real_time: fake, real_time.time: clock.time, real_time.monotonic: clock.monotonic,
             real_time.sleep: clock.sleep, real_time.perf_counter: clock.perf_counter}
    undo, names = [], []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(prefixes):
            continue
        for attr, value in list(vars(mod).items()):
            try:
                swap = swaps.get(value)
            except TypeError:  # unhashable
                continue
            if swap is not None:
                undo.append((mod, attr, value))
                setattr(mod, attr, swap)
                names.append(f"{mod_name}.{attr}")
    try:
        yield names
    finally:
        for mod, attr, value in undo:
            setattr(mod, attr, value)
