"""Run folders for the report tests and benchmark, shaped as `harness tune` writes them.

    runs/<study>/study.json, study.toml, trials.jsonl, trials/<id>/{plan.toml, command.txt,
    result.json, logs/}, best.toml, optuna.journal

`synthetic_records` makes a study of any size from a toy performance model (schema-1
TrialResult dicts with the tags the tuner writes, leave-one-out trials included). A
real study's folder for the report tests is the session's quickstart study
(tests/conftest.py).
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import tomli_w

GiB = 2**30
ROOT = Path(__file__).resolve().parents[2]
ENV = {"harness": "0.1.0", "git": {"commit": "0" * 40, "dirty": False}, "python": "3.11.7",
       "torch": "2.13.0+cu128", "cuda": "12.8", "cudnn": 91000, "nccl": "2.27.3",
       "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "gpu_names": ["NVIDIA H100"],
       "driver": "570.86", "hostname": "node-1", "cpu": "AMD EPYC", "cpu_count": 64,
       "platform": "Linux", "packages": {"optuna": "5.0.0"}, "env": {"HARNESS_NODE_RANK": "0"}}
TECHNIQUES = {"amp": {"dtype": "bf16"}, "checkpoint": {"every": 1},
              "fused": {"attention": "sdpa", "optimizer": "fused"}, "lamb": {}}
LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)]


def plan(name: str, strategies: dict, mbs: int, layout=(1, 1, 1)) -> dict[str, Any]:
    return {"name": name, "workload": {"name": "gpt", "layers": 12, "hidden": 768},
            "device": "cuda", "layout": dict(zip(("data", "pipeline", "tensor"), layout,
                                                 strict=True)),
            "micro_batch_size": mbs, "strategies": copy.deepcopy(strategies),
            "warmup_steps": 2, "steps": 10, "seed": 0, "timeout_s": 900.0}


def model(p: dict, rng: random.Random, thr_scale: float = 1.0) -> tuple[float, float]:
    """(samples/s, peak bytes) of a plan under a toy model of the techniques."""
    s, mbs, lay = p["strategies"], p["micro_batch_size"], p["layout"]
    thr = 60 * mbs ** 0.35 * thr_scale
    thr *= (1.7 if "amp" in s else 1) * (0.78 if "checkpoint" in s else 1)
    thr *= (1.12 if "fused" in s else 1) * (0.97 if "lamb" in s else 1)
    thr *= {2: 1.85}.get(lay["data"], 1) * {2: 1.45}.get(lay["pipeline"], 1)
    thr *= {2: 1.55}.get(lay["tensor"], 1)
    act = mbs * 0.9 * GiB * (0.55 if "amp" in s else 1) * (0.3 if "checkpoint" in s else 1)
    mem = 3 * GiB + act / lay["pipeline"] / lay["tensor"] + (0.5 * GiB if "lamb" in s else 0)
    return thr * rng.lognormvariate(0, 0.03), mem * rng.lognormvariate(0, 0.01)


def record(study: str, tid: int, p: dict, rng: random.Random, phase: str, *,
           status: str = "ok", reason: str | None = None, thr_scale: float = 1.0,
           tags: dict | None = None, device_memory: float = math.inf) -> dict[str, Any]:
    thr, mem = model(p, rng, thr_scale)
    if status == "ok" and mem > device_memory:
        status, reason = "oom", "out of memory: CUDA out of memory. Tried to allocate 1.50 GiB"
    pred = mem * rng.lognormvariate(0.05, 0.08)
    world = math.prod(p["layout"].values())
    metrics: dict[str, Any] = {
        "step_time_s": {"median": None, "p10": None, "p90": None, "n": 0},
        "samples_per_s": None, "tokens_per_s": None, "tflops_per_device": None, "mfu": None,
        "peak_flops_source": None, "peak_memory_bytes": None, "energy_j_per_sample": None,
        "memory": {"allocated": None, "reserved": None, "nvml_used": None, "rss": None},
        "loss": {"first": None, "last": None, "finite": None}}
    if status == "ok":
        step = p["micro_batch_size"] * p["layout"]["data"] / thr
        times = sorted(step * rng.lognormvariate(0, 0.04) for _ in range(p["steps"]))
        loss = [10.5 - 0.05 * i + rng.gauss(0, 0.02) for i in range(p["warmup_steps"]
                                                                     + p["steps"])]
        metrics.update({
            "step_time_s": {"median": times[len(times) // 2], "p10": times[1], "p90": times[-2],
                            "n": len(times), "min": times[0], "max": times[-1]},
            "step_times_s": times, "samples_per_s": thr, "tokens_per_s": thr * 1024,
            "tflops_per_device": thr * 1.1 / world, "mfu": min(0.9, thr * 1.1 / world / 989),
            "peak_flops_source": "datasheet: NVIDIA H100 SXM bf16 dense",
            "peak_memory_bytes": int(mem),
            "memory": {"allocated": int(mem * 0.95), "reserved": int(mem), "nvml_used": None,
                       "rss": None},
            "energy_j_per_sample": 700 / thr,
            "loss": {"first": loss[0], "last": loss[-1], "finite": True, "values": loss,
                     "warmup_steps": p["warmup_steps"]}})
    elif status != "pruned":
        metrics["traceback_tail"] = f"Traceback (most recent call last):\n  ...\n{reason}\n"
    return {"schema": 1, "study": study, "trial_id": tid, "status": status, "reason": reason,
            "plan": p, "predicted": {"peak_memory_bytes": int(pred), "step_time_s": 0.1},
            "metrics": metrics, "env": ENV, "started_at": "2026-11-21T10:00:00+00:00",
            "command": f"harness bench runs/{study}/trials/{tid}/plan.toml",
            "duration_s": 0.0 if status == "pruned" else 30 + rng.random() * 20,
            "tags": {"phase": phase, **(tags or {})}}


def synthetic_records(n: int, study: str = "toy", seed: int = 0, budget: float = 12 * GiB,
                      device_memory: float = 14 * GiB, ablation: bool = True,
                      thr_scale: float = 1.0) -> list[dict[str, Any]]:
    """About n trials: baseline, known-good, search, then leave-one-out of the best."""
    rng = random.Random(seed)
    recs = [record(study, 0, plan("baseline", {}, 8), rng, "baseline", thr_scale=thr_scale)]
    n_search = max(0, n - 1 - (13 if ablation and n > 20 else 0))
    for i in range(1, n_search + 1):
        if i == 1:
            p = plan("known-good", {k: TECHNIQUES[k] for k in ("amp", "fused")}, 8)
        else:
            on = {k: v for k, v in TECHNIQUES.items() if rng.random() < 0.5}
            p = plan(f"t{i}", on, rng.choice([4, 8, 16, 32]), rng.choice(LAYOUTS))
        thr, mem = model(p, random.Random(seed * 1000 + i))
        pred = mem * 1.05
        status, reason = "ok", None
        if pred > budget:
            status, reason = "pruned", f"predicted peak memory {pred / GiB:.1f} GiB is over " \
                                       f"the budget of {budget / GiB:.1f} GiB"
        elif mem > device_memory:
            status, reason = "oom", "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB"
        elif rng.random() < 0.05:
            status, reason = rng.choice([
                ("failed", f"rank {rng.randrange(2)} failed: RuntimeError: NCCL error\n"
                           "last lines of stderr:\n  ncclInternalError"),
                ("timeout", "no progress for 900 s: every rank stopped"),
                ("diverged", "loss is nan at step 3 on rank 0")])
        recs.append(record(study, i, p, rng, "known-good" if i == 1 else "search",
                           status=status, reason=reason, thr_scale=thr_scale,
                           tags={"optuna_number": i - 1}))
    if ablation and n > 20:
        recs += ablation_records(recs, rng, thr_scale, device_memory=device_memory)
    return recs


def best_of(recs: list[dict]) -> dict:
    ok = [r for r in recs if r["status"] == "ok" and r["tags"].get("phase") != "ablation"]
    return max(ok, key=lambda r: r["metrics"]["samples_per_s"])


def ablation_records(recs: list[dict], rng: random.Random, thr_scale: float = 1.0,
                     repeats: int = 3, device_memory: float = math.inf) -> list[dict]:
    best, out = best_of(recs), []
    tid = max(int(r["trial_id"]) for r in recs) + 1
    for without in [None, *sorted(best["plan"]["strategies"])]:
        for rep in range(repeats):
            p = copy.deepcopy(best["plan"])
            p["strategies"].pop(without, None)
            out.append(record(best["study"], tid, p, rng, "ablation", thr_scale=thr_scale,
                              device_memory=device_memory,
                              tags={"ablation": {"of": best["trial_id"], "without": without,
                                                 "repeat": rep}}))
            tid += 1
    return out


def write_run(root: Path, recs: list[dict], journal: bool = True, **study: Any) -> Path:
    """The folder `harness tune` writes, for these records, written with the tuner's own
    RunStore so that a change of the contract shows here."""
    from training_harness.records.run_store import RunStore, write_atomic

    name = study.pop("name", None) or (recs[0]["study"] if recs else "empty")
    run = Path(root)
    (run / "trials.jsonl").unlink(missing_ok=True)
    store = RunStore(run)
    store.create(f'name = {json.dumps(name)}\n[budget]\ntime = "1h"\n')
    best = best_of(recs) if any(r["status"] == "ok" for r in recs) else None
    base = next((r for r in recs if r["tags"].get("phase") == "baseline"), None)
    info = {"name": name, "objective": ["throughput", "memory"],
            "directions": ["maximize", "minimize"], "budget_s": 3600,
            "memory_budget_bytes": 12 * GiB, "device": "cuda",
            "started_at": "2026-11-21T10:00:00+00:00", "finished_at": "2026-11-21T11:00:00+00:00",
            "storage": f"journal:{run / 'optuna.journal'}", "harness_version": "0.1.0",
            "best_trial_id": best and best["trial_id"],
            "baseline_trial_id": base and base["trial_id"], "n_trials": len(recs),
            "stopped_because": "budget", **study}
    store.update_info(**info)
    for r in recs:
        d = store.write_trial_files(r["trial_id"], tomli_w.dumps(_toml_safe(r["plan"])),
                                    r["command"])
        (d / "logs").mkdir(exist_ok=True)
        write_atomic(d / "result.json", json.dumps(r, indent=1))
        store.append(r)
    if best:
        write_atomic(store.best_toml, tomli_w.dumps(_toml_safe(best["plan"])))
    if journal:
        (run / "optuna.journal").unlink(missing_ok=True)
        write_journal(run / "optuna.journal", name, recs)
    return run


def _toml_safe(p: dict) -> dict:
    return json.loads(json.dumps(p))


def write_journal(path: Path, name: str, recs: list[dict]) -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution as Cat
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, directions=["maximize", "minimize"],
                                storage=JournalStorage(JournalFileBackend(str(path))))
    dists = {k: Cat([False, True]) for k in TECHNIQUES}
    dists.update(micro_batch_size=Cat([1, 2, 4, 8, 16, 32]),
                 layout=Cat(["1x1x1", "2x1x1", "1x2x1", "1x1x2"]))
    state = optuna.trial.TrialState
    for r in recs:
        if r["tags"].get("phase") == "ablation":
            continue
        p = r["plan"]
        params = {k: k in p["strategies"] for k in TECHNIQUES}
        params["micro_batch_size"] = p["micro_batch_size"]
        params["layout"] = "x".join(str(v) for v in p["layout"].values())
        m = r["metrics"]
        ok = r["status"] == "ok"
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params},
            values=[m["samples_per_s"], m["peak_memory_bytes"]] if ok else None,
            state=state.COMPLETE if ok else (state.PRUNED if r["status"] == "pruned"
                                             else state.FAIL)))
