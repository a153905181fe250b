"""A Launcher (training_harness.launch.launcher) whose trials are a response surface's answers, on a
virtual clock.

`launch` asks the surface for the plan (its repeat: how many times this configuration
was launched before in the run), then plays the trial out on the clock: OVERHEAD_S
(the launcher's own work: prepared.json, processes, the record), the time before the
first step (wall_s less the steps: start, compile), the warm-up steps, then each measured
step, appending "<step> <seconds>" to the trial's steps.log as rank 0 does
(training_harness.records.step_log) and polling `should_stop` after each, so the tuner's own
slow-trial rule (training_harness.tune.search.slow_trials) can cut it: a `pruned` record that
cost what was played so far. A trial past its `timeout_s` is a `timeout` record at
that time. OOM and failed trials cost their wall_s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.benchmarks.surface_replay.world import VirtualClock
from training_harness.launch.launcher import Launcher
from training_harness.records.result import TrialResult, empty_metrics
from training_harness.study.search_space import config_key

OVERHEAD_S = 2.0  # virtual seconds a launched trial costs beyond the surface's wall_s
Surface = Callable[[dict[str, Any], int], dict[str, Any]]


class SurfaceLauncher(Launcher):
    def __init__(self, surface: Surface, clock: VirtualClock):
        self.surface = surface
        self.clock = clock
        self.repeats: Counter[str] = Counter()
        self.launched: list[dict[str, Any]] = []  # (trial_id, plan, status, cost): for the report

    def launch(self, prepared: Any, out_dir: str | Path, command: str, *, study: str | None = None,
               trial_id: int | str | None = None, timeout_s: float | None = None,
               progress_file: str | Path | None = None,
               should_stop: Callable[[], str | None] | None = None, **_: Any) -> TrialResult:
        plan = prepared.plan.to_dict()
        key = config_key(plan)
        repeat = self.repeats[key]
        self.repeats[key] += 1
        out = self.surface(plan, repeat)
        t0 = self.clock.now
        limit = float("inf") if timeout_s is None else timeout_s
        status, reason = out["status"], out.get("reason")
        metrics = empty_metrics()
        n_steps = prepared.plan.warmup_steps + prepared.plan.steps
        step = out.get("step_time_s") or (
            prepared.plan.batch_size / out["samples_per_s"] if out.get("samples_per_s") else 0.0)
        wall = float(out["wall_s"])

        def spend(seconds: float) -> bool:
            """Advance the clock; False when the trial's timeout came first."""
            if self.clock.now - t0 + seconds > limit:
                self.clock.advance(max(0.0, limit - (self.clock.now - t0)))
                return False
            self.clock.advance(seconds)
            return True

        timed_out = not spend(OVERHEAD_S)
        if status != "ok":
            timed_out = timed_out or not spend(wall)
            metrics["peak_memory_bytes"] = out.get("peak_memory_bytes")
        else:
            timed_out = timed_out or not spend(max(0.0, wall - n_steps * step))
            timed_out = timed_out or not spend(prepared.plan.warmup_steps * step)
            first = prepared.plan.warmup_steps
            for k in range(prepared.plan.steps if not timed_out else 0):
                if not spend(step):
                    timed_out = True
                    break
                if progress_file is not None:
                    with open(progress_file, "a") as f:
                        f.write(f"{first + k} {step!r}\n")
                if should_stop is not None and (why := should_stop()):
                    status, reason = "pruned", why
                    break
            if status == "ok" and not timed_out:
                metrics.update(self._measured(prepared, out, step))
        if timed_out:
            status = "timeout"
            reason = f"no result after {limit:g} s; the trial was stopped"
            metrics = empty_metrics()
        result = TrialResult(
            study=study, trial_id=trial_id, status=status, reason=reason, plan=plan,
            predicted=prepared.predicted, metrics=metrics, env=dict(prepared.env),
            command=command, started_at="", duration_s=self.clock.now - t0)
        self.launched.append({"trial_id": trial_id, "plan": plan, "status": status,
                              "cost_s": self.clock.now - t0})
        return result

    @staticmethod
    def _measured(prepared: Any, out: dict[str, Any], step: float) -> dict[str, Any]:
        rate = out["samples_per_s"]
        peak = out.get("peak_memory_bytes")
        world = prepared.plan.layout.data * prepared.plan.layout.pipeline * \
            prepared.plan.layout.tensor
        flops = prepared.flops_per_sample * rate / world
        peak_flops = (prepared.peak or {}).get("flops")
        return {
            "step_time_s": {"median": step, "p10": step, "p90": step,
                            "n": prepared.plan.steps},
            "samples_per_s": rate,
            "tokens_per_s": rate * prepared.tokens_per_sample if prepared.tokens_per_sample
            else None,
            "tflops_per_device": flops / 1e12,
            "mfu": flops / peak_flops if peak_flops else None,
            "peak_flops_source": (prepared.peak or {}).get("source"),
            "peak_memory_bytes": peak,
            "memory": {"allocated": out.get("allocated_bytes", peak),
                       "reserved": out.get("reserved_bytes", peak), "nvml_used": peak,
                       "rss": None, "device_base": out.get("device_base_bytes")},
        }
