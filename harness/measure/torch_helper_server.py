"""The tuner's torch side: one helper per tuner answers what needs torch.

    a fork of the rank server running `answer` (training_harness.launch.rank_server.serve), or
    python -m training_harness.measure.torch_helper_server      (where ranks are not forked)

The tuner process never imports torch (nor touches a device): checking a study
against the strategy registry, and checking, estimating and counting the FLOPs
of each plan, happen here. One JSON request a line on stdin, one JSON answer a
line on stdout:

    {"op": "devices"}                   {"ok": {"cuda": <visible CUDA devices>}}
    {"op": "study", "study": {...}}     {"ok": MachineFacts}
    (training_harness.study.machine_facts)
    {"op": "prepare", "plan": {...},    {"ok": PreparedPlan, (training_harness.core.prepared)
     "peaks": {...}}                     "phases_s": {phase: seconds}}
                                        (the study's fixed peaks by compute dtype)

A user's mistake (a plan or study this machine refuses) is {"error": message,
"exit_code": n}; anything else that goes wrong, {"crash": traceback}. Every
request carries the tuner's working folder and import path, so a user's workload
module imports here as it would there. It ends when its stdin (or connection) closes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Any

_ENV_CACHE: dict[str, dict[str, Any]] = {}  # device type -> captured environment


def _env_for(device_type: str) -> dict[str, Any]:
    import torch

    from training_harness.measure.env import capture_env

    if device_type not in _ENV_CACHE:
        _ENV_CACHE[device_type] = capture_env(torch.device(device_type))
    return _ENV_CACHE[device_type]


def devices() -> dict[str, Any]:
    import torch

    return {"cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def study_facts(table: dict[str, Any]) -> dict[str, Any]:
    import torch

    from training_harness.core.device import RuntimeEnv, resolve_device
    from training_harness.measure.device_profile import cached_profile
    from training_harness.measure.memory import device_memory_bytes
    from training_harness.measure.prepare import study_peaks
    from training_harness.strategies import registry
    from training_harness.study.checks import check_study, resolve_settings
    from training_harness.study.machine_facts import MachineFacts
    from training_harness.study.study_file import Study
    from training_harness.workloads import load_workload

    study = Study.from_dict(table)
    device_type = resolve_device(study.device).type
    check_study(study, device_type)  # normalises known_good in place
    settings = resolve_settings(study, device_type)
    runtime = RuntimeEnv.detect(device_type)
    workload = load_workload(study.workload, study.workload_args)
    facts = MachineFacts(
        device_type=device_type, device_name=runtime.device_name,
        device_count=runtime.device_count, device_memory_bytes=device_memory_bytes(device_type),
        settings=settings, defaults={s.name: s.defaults() for s in registry.all_strategies()},
        known_good=study.known_good, env=_env_for(device_type),
        peaks=study_peaks(device_type, _study_dtypes(settings, study.known_good), workload),
        profile_measured=(cached_profile(torch.device(device_type), runtime.device_name)
                          or {}).get("measured_at", ""))
    return facts.to_json()


def _study_dtypes(settings: dict[str, Any], known_good: dict[str, Any] | None) -> list[str]:
    """The compute dtypes a study's trials can run in: fp32, and amp's dtypes."""
    from training_harness.measure.peaks import autocast_dtype_name

    dtypes = {"fp32"}
    if "amp" in settings:
        amp = settings["amp"]
        values = [amp.fixed.get("dtype", amp.defaults.get("dtype", "bf16"))]
        if "dtype" in amp.searched:
            values += list(getattr(amp.searched["dtype"], "values", ()))
        dtypes |= {autocast_dtype_name({"amp": {"dtype": v}}) for v in values}
    if known_good:
        dtypes.add(autocast_dtype_name(known_good.get("strategies") or {}))
    return sorted(dtypes)


def prepare(table: dict[str, Any], peaks: dict[str, Any] | None = None,
            phases: dict[str, float] | None = None) -> dict[str, Any]:
    """The plan prepared (training_harness.measure.prepare); `phases` gets its seconds, by phase."""
    import time

    from training_harness.core.plan import Plan
    from training_harness.measure.prepare import prepare as prepare_plan

    prep = prepare_plan(Plan.from_dict(table, where="plan"), peaks=peaks, phases=phases)
    t0 = time.perf_counter()
    env = _env_for(prep.device.type)
    if phases is not None:
        phases["env"] = time.perf_counter() - t0
    return prep.checked(env=env).to_dict()


OPS = {"devices": lambda r, _: devices(), "study": lambda r, _: study_facts(r["study"]),
       "prepare": lambda r, phases: prepare(r["plan"], r.get("peaks"), phases)}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    from training_harness.core.errors import HarnessError

    if request.get("cwd"):
        os.chdir(request["cwd"])
    for entry in reversed(request.get("path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    phases: dict[str, float] = {}
    try:
        ok = OPS[request["op"]](request, phases)
        return {"ok": ok, "phases_s": phases} if phases else {"ok": ok}
    except HarnessError as e:
        return {"error": str(e), "exit_code": e.exit_code}
    except Exception:
        return {"crash": traceback.format_exc()[-4000:]}


def main() -> int:
    # Ctrl-C reaches the whole process group: the tuner decides what stops, and this
    # helper ends when the tuner closes its stdin (or dies).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = sys.stdout
    sys.stdout = sys.stderr  # a print anywhere below must not break the protocol
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(answer(json.loads(line)), default=str) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
