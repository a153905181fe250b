"""A launcher for tuner tests: no processes, a known objective, the launcher's files.

`launch` has training_harness.launch.local.launch's signature (it gets the prepared plan,
and imports no torch). Its throughput is `objective(plan)`, deterministic, so a
test can measure the whole space and know the optimum. It writes plan.toml and
result.json into the trial's folder as the real one does, and sleeps FAKE_TRIAL_S
seconds (default 0) in small steps, writing step times to the progress file and
honouring `should_stop` and the timeout. With FAKE_LOG set it appends each
launch's trial id to that file; with FAKE_WINDOW_S, the record's measured window lasts
that many seconds. With FAKE_WAIT_FOR_WORKERS=n as well, a process's first launch waits
until n processes have launched (FAKE_LOG), or `should_stop` says stop: a helper worker
importing torch on a loaded machine then joins before the first worker ends the study.
FAKE_HELPER_TRIAL_S, where set, is a helper worker's (`--helper`) FAKE_TRIAL_S.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from training_harness.core.plan import Plan
from training_harness.records.result import TrialResult, empty_metrics

CALLS: list[dict] = []  # what was launched, in this process
# A test's hook (in-process studies): (plan dict, rate, launch index) -> (rate, the
# record's metrics.interference or None): a lucky measurement, a busy machine.
TWEAK = None


def objective(plan: Plan | dict) -> float:
    """Samples/s of a configuration of the quickstart space: optimum micro 8, fused with
    sdpa + fused optimizer, no amp, no checkpoint (unique)."""
    d = plan.to_dict() if isinstance(plan, Plan) else plan
    s = d.get("strategies", {})
    rate = {4: 100.0, 8: 130.0, 16: 120.0}.get(d["micro_batch_size"], 90.0)
    if "fused" in s:
        rate *= 1.25 if s["fused"].get("attention") == "sdpa" else 1.02
        rate *= 1.10 if s["fused"].get("optimizer") == "fused" else 1.04
    if "amp" in s:
        rate *= 1.15 if d["micro_batch_size"] == 16 else 0.85
    if "checkpoint" in s:
        rate *= 0.8
    return rate


def peak_bytes(plan: Plan | dict) -> int:
    d = plan.to_dict() if isinstance(plan, Plan) else plan
    scale = 0.5 if "checkpoint" in d.get("strategies", {}) else 1.0
    return int((200 + 20 * d["micro_batch_size"] * scale) * 2**20)


_WAITED: list[bool] = []  # this process's first launch has waited


def _wait_for_workers(log: str, should_stop) -> None:
    wanted = int(os.environ.get("FAKE_WAIT_FOR_WORKERS", "0"))
    if _WAITED or not wanted:
        return
    _WAITED.append(True)
    while len({line.split()[1] for line in Path(log).read_text().splitlines()
               if len(line.split()) == 2}) < wanted:  # a line being written is left out
        if should_stop is not None and should_stop():
            return
        time.sleep(0.1)


def launch(prep, out_dir, command, *, study=None, trial_id=None, timeout_s=None,
           progress_file=None, should_stop=None, **_):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.toml").write_text(prep.plan.to_toml())
    CALLS.append({"trial_id": trial_id, "plan": prep.plan.to_dict()})
    if os.environ.get("FAKE_LOG"):  # launches across processes, for the process tests
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(f"{trial_id} {os.getpid()}\n")
        _wait_for_workers(os.environ["FAKE_LOG"], should_stop)
    helper = "--helper" in sys.argv and "FAKE_HELPER_TRIAL_S" in os.environ
    total = float(os.environ.get("FAKE_HELPER_TRIAL_S" if helper else "FAKE_TRIAL_S", "0"))
    rate, busy = objective(prep.plan), None
    if TWEAK is not None:
        rate, busy = TWEAK(prep.plan.to_dict(), rate, len(CALLS) - 1)
    step_s = prep.plan.batch_size / rate
    t0, status, reason = time.monotonic(), "ok", None
    steps = prep.plan.steps
    for i in range(steps):
        time.sleep(total / steps)
        if progress_file:
            with open(progress_file, "a") as f:
                f.write(f"{i} {step_s!r}\n")
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            status, reason = "timeout", f"no result after {timeout_s:g} s; the trial was stopped"
            break
        if should_stop is not None and (why := should_stop()):
            status, reason = "pruned", why
            break
    metrics = empty_metrics()
    if status == "ok":
        metrics.update(step_time_s={"median": step_s, "p10": step_s, "p90": step_s, "n": steps},
                       samples_per_s=rate, peak_memory_bytes=peak_bytes(prep.plan))
        metrics["memory"] = {"allocated": None, "reserved": None, "nvml_used": None,
                             "rss": peak_bytes(prep.plan), "rss_base": 150 * 2**20}
        metrics["peak_flops"] = prep.peak  # as a real trial records its MFU's denominator
        metrics["interference"] = busy
        if os.environ.get("FAKE_WINDOW_S"):  # a measured window of this many seconds
            metrics["window"] = {"seconds": float(os.environ["FAKE_WINDOW_S"]), "steps": steps}
    result = TrialResult(study=study, trial_id=trial_id, status=status, reason=reason,
                         plan=prep.plan.to_dict(), predicted=prep.predicted, metrics=metrics,
                         command=command, started_at="", duration_s=time.monotonic() - t0)
    if os.environ.get("FAKE_CAPTURE_ENV"):  # as a real trial records its environment
        result.env = prep.env
    result.write(out / "result.json")
    return result
