"""`harness verify RUN --with hf-trainer --top K`: the study's K best configurations
trained again inside the Hugging Face Trainer, each in its own processes
(training_harness.export.hf_run; torchrun for data parallel), with the exported settings and the
same micro-batch, model, data and timed steps; the two throughputs side by side, their
ratio, whether the ranking holds, and any setting the running Trainer did not take.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.export import export_plan
from training_harness.records.plan_text import describe_plan
from training_harness.records.predicates import busy_note, ranked
from training_harness.records.run_store import RunStore


@dataclass
class Row:
    """One configuration: the harness's figure and the Trainer's (or why it has none)."""

    trial_id: Any
    describe: str
    study_rate: float  # the study's record
    busy: str | None = None
    trainer_rates: list[float] = field(default_factory=list)
    cannot: str | None = None  # why the Trainer cannot run it as measured
    failed: str | None = None  # it was started and did not finish
    lost: list[str] = field(default_factory=list)  # settings the running Trainer did not take
    nearest: list[str] = field(default_factory=list)  # settings run as their nearest
    capped: bool = False  # the harness ran it under an allocator cap (a memory budget)
    observed: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    bench_rates: list[float | None] = field(default_factory=list)  # --bench, beside each run

    @property
    def trainer_rate(self) -> float | None:
        """The Trainer's samples/s: the median over the repeats."""
        return statistics.median(self.trainer_rates) if self.trainer_rates else None

    @property
    def bench_rate(self) -> float | None:
        """harness bench's samples/s beside the Trainer's runs (--bench): their median."""
        rates = [r for r in self.bench_rates if r]
        return statistics.median(rates) if rates else None

    @property
    def harness_rate(self) -> float:
        """The figure the Trainer's is compared with: measured beside it where --bench."""
        return self.bench_rate or self.study_rate

    @property
    def ratio(self) -> float | None:
        return self.trainer_rate / self.harness_rate if self.trainer_rate else None


def top_records(run: Path, k: int) -> list[dict[str, Any]]:
    store = RunStore(run)
    if not store.trials_jsonl.exists():
        raise HarnessError(f"{run}: no trials.jsonl here; give a run folder of harness tune")
    rows = [r for r in ranked(store.records()) if (r["metrics"] or {}).get("samples_per_s")]
    if not rows:
        raise HarnessError(f"{run}: no configuration ran ok with a throughput; nothing to verify")
    return rows[:k]


def settings_lost(args: dict[str, Any], seen: dict[str, Any], world: int,
                  model_kwargs: dict[str, Any] | None = None) -> list[str]:
    """Each exported setting the running Trainer did not use, in words (`model_kwargs`:
    the sidecar's, for the model's attention)."""
    fsdp = bool(args.get("fsdp"))
    ckpt = bool(args.get("activation_checkpointing")) or bool(
        (args.get("fsdp_config") or {}).get("activation_checkpointing"))
    precision = "bf16" if args.get("bf16") else "fp16" if args.get("fp16") else "no"
    kind = "NO" if world == 1 else "FSDP" if fsdp else "DEEPSPEED" if args.get(
        "deepspeed") else "MULTI_GPU" if not args.get("use_cpu") else "MULTI_CPU"
    want = {
        "per_device_train_batch_size": args["per_device_train_batch_size"],
        "gradient_accumulation_steps": args["gradient_accumulation_steps"],
        "micro_steps_per_step": [args["gradient_accumulation_steps"]],
        "mixed_precision": precision,
        "optim": args.get("optim", "adamw_torch"),
        "optimizer_fused": args.get("optim") == "adamw_torch_fused",
        "checkpointing": ckpt,
        "torch_compile": bool(args.get("torch_compile")),
        "world_size": world,
        "distributed_type": kind,
    }
    attention = (model_kwargs or {}).get("attn_implementation")
    if attention:
        want["attn_implementation"] = attention
    got = {**seen, "checkpointing": bool(seen.get("model_is_gradient_checkpointing")
                                         or seen.get("checkpoint_wrapped_layers"))}
    return [f"{k}: exported {v!r}, the Trainer ran {got.get(k)!r}" for k, v in want.items()
            if got.get(k) != v]


def _command(world: int, plan: Path, args: Path, out: Path) -> list[str]:
    run = ["-m", "training_harness.export.hf_run", str(plan), str(args), str(out)]
    if world == 1:
        return [sys.executable, *run]
    from training_harness.core.ports import free_port

    return [sys.executable, "-m", "training_harness.launch.torchrun_agent", "--nnodes", "1",
            "--nproc-per-node", str(world), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), *run]


def bench_again(folder: Path, repeat: int, timeout_s: float) -> float | None:
    """`harness bench` of the plan in `folder`, now: its samples/s, None if it failed."""
    out = folder / f"bench-{repeat}"
    with open(folder / f"bench-{repeat}.log", "w") as log:
        try:
            subprocess.run([sys.executable, "-m", "training_harness", "bench",
                            str(folder / "plan.toml"),
                            "--out", str(out)], stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None
    try:
        record = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return record["metrics"].get("samples_per_s") if record["status"] == "ok" else None


def verify_one(record: dict[str, Any], folder: Path, timeout_s: float,
               bench: bool = False, repeats: int = 1,
               also: dict[str, set[str]] | None = None) -> Row:
    """`also`: the settings the rows' lines show beyond the main ones (records.plan_text)."""
    plan = Plan.from_dict(record["plan"])
    m = record["metrics"]
    row = Row(record["trial_id"], describe_plan(record["plan"], also), m["samples_per_s"],
              busy_note(record))
    if not plan.workload.startswith("hf:"):
        row.cannot = f"workload {plan.workload}: the Trainer verify builds hf: models"
        return row
    try:
        exp = export_plan(plan, "hf-trainer", str(folder / "plan.toml"))
    except HarnessError as e:
        row.cannot = str(e)
        return row
    if exp.missing():
        row.cannot = "; ".join(n.line() for n in exp.missing())
        return row
    # the settings of how the harness measured (its allocator cap) are said once, in the table
    row.nearest = [f"{n.setting} -> {n.nearest}" for n in exp.not_expressed
                   if not n.setting.startswith(("memory_budget_bytes", "expandable_segments"))]
    row.capped = bool(plan.memory_budget_bytes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.toml").write_text(plan.to_toml())
    (folder / "trainer.json").write_text(exp.text)
    (folder / "trainer.harness.json").write_text(exp.sidecar())
    fields = json.loads(exp.text)
    model_kwargs = exp.harness.get("model_kwargs") or {}
    steps = (m.get("window") or {}).get("steps") or plan.steps
    fields["harness_run"] = {"warmup": max(plan.warmup_steps, 1), "steps": steps,
                             "model_kwargs": model_kwargs}
    run_args = folder / "trainer_run.json"
    run_args.write_text(json.dumps(fields, indent=2))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if plan.expandable_segments and plan.device != "cpu":  # as the harness's trial had it
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    for i in range(repeats):
        # harness bench beside each Trainer run (the same minutes of a drifting machine),
        # first on even repeats and second on odd ones, so neither always goes first
        if bench and i % 2 == 0:
            row.bench_rates.append(bench_again(folder, i, timeout_s))
        out = folder / ("result.json" if i == 0 else f"result-{i}.json")
        result, row.failed = _trainer_run(plan, folder, run_args, out, env, timeout_s)
        if result is None:
            return row
        row.trainer_rates.append(result["samples_per_s"])
        if bench and i % 2 == 1:
            row.bench_rates.append(bench_again(folder, i, timeout_s))
    row.observed = result["observed"]
    row.versions = result.get("versions") or {}
    row.lost = settings_lost(fields, result["observed"], plan.world_size, model_kwargs)
    return row


def _trainer_run(plan: Plan, folder: Path, run_args: Path, out: Path, env: dict[str, str],
                 timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """One Trainer run in its own processes: (its result.json, None), or (None, why not)."""
    out.unlink(missing_ok=True)
    cmd = _command(plan.world_size, folder / "plan.toml", run_args, out)
    log_path = folder / "log.txt"
    with open(log_path, "w") as log:
        try:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s:.0f} s (log: {log_path})"
    if done.returncode or not out.exists():
        return None, f"exit {done.returncode}: {_cause(log_path)[:300]} (log: {log_path})"
    return json.loads(out.read_text()), None


def _cause(log_path: Path) -> str:
    """The log's last exception line (a rank's, above torchrun's summary of ====
    rules), else its last line."""
    lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()
             if ln.strip() and not ln.strip().startswith("===")]
    errors = [ln for ln in lines if _EXCEPTION.match(ln)]
    return (errors or lines or ["no output"])[-1]


_EXCEPTION = re.compile(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Interrupt)\b")


def ranking(rows: list[Row]) -> str:
    """Whether the Trainer orders the configurations it ran as the harness did."""
    ran = [r for r in rows if r.trainer_rate]
    if len(ran) < 2:
        return "ranking: fewer than two configurations ran in the Trainer; nothing to compare"
    order = sorted(ran, key=lambda r: -r.trainer_rate)
    if [r.trial_id for r in order] == [r.trial_id for r in ran]:
        return (f"ranking: holds (the Trainer orders the {len(ran)} configurations it ran "
                "as the harness did)")
    text = ("ranking: differs: the Trainer orders them " + " > ".join(
        f"trial {r.trial_id}" for r in order) + ", the harness " + " > ".join(
        f"trial {r.trial_id}" for r in ran))
    if any(len(r.trainer_rates) < 2 for r in ran):
        return text + " (one Trainer run each: --repeats 3 says whether it is beyond the noise)"
    swapped = [(a, b) for i, a in enumerate(ran) for b in ran[i + 1:]
               if b.trainer_rate > a.trainer_rate]
    if all(max(a.trainer_rates) >= min(b.trainer_rates) for a, b in swapped):
        return text + (" (each swap within the Trainer's spread over its repeats: not beyond "
                       "the noise)")
    return text


def _cell(value: float | None) -> str:
    return f"{value:>10.2f}" if value else f"{'-':>10}"


def _spread(rates: list[float]) -> str:
    return f"{statistics.median(rates):.2f} [{min(rates):.2f}, {max(rates):.2f}]"


def table(rows: list[Row]) -> str:
    """samples/s: the study's, harness bench's again (--bench), the Trainer's; the ratio is
    the Trainer's over the harness's (bench's where measured, else the study's)."""
    benched = any(r.bench_rate for r in rows)
    head = (f"{'#':>3}  {'trial':>6}  {'study/s':>10}  " + (f"{'bench/s':>10}  " if benched
                                                           else "")
            + f"{'trainer/s':>10}  {'ratio':>6}  configuration")
    lines = [head]
    for i, r in enumerate(rows, 1):
        mark = "~" if r.busy else " "
        ratio = f"{r.ratio:>6.2f}" if r.ratio else f"{'-':>6}"
        lines.append(f"{i:>2}{mark}  {r.trial_id!s:>6}  {_cell(r.study_rate)}  "
                     + (f"{_cell(r.bench_rate)}  " if benched else "")
                     + f"{_cell(r.trainer_rate)}  {ratio}  {r.describe}")
    for i, r in enumerate(rows, 1):
        if r.cannot:
            lines.append(f"  #{i} (trial {r.trial_id}) the Trainer cannot run it as measured: "
                         f"{r.cannot}")
        if r.failed:
            lines.append(f"  #{i} (trial {r.trial_id}) failed in the Trainer: {r.failed}")
        if len(r.trainer_rates) > 1:
            bench = [b for b in r.bench_rates if b]
            lines.append(f"  #{i} samples/s over {len(r.trainer_rates)} repeats: Trainer "
                         f"{_spread(r.trainer_rates)}" + (f"; harness bench {_spread(bench)}"
                                                          if bench else ""))
        lines += [f"  #{i} ran as its nearest equivalent: {text}" for text in r.nearest]
        if r.trainer_rate and not r.lost:
            lines.append(f"  #{i} settings read back from the running Trainer: as exported")
        lines += [f"  #{i} setting lost in the Trainer: {text}" for text in r.lost]
        if r.busy:
            lines.append(f"  #{i} ~ the harness measured it while the machine was busy "
                         f"({r.busy})")
    if any(r.capped and r.trainer_rates for r in rows):
        lines.append("  the harness ran these under the study's memory budget (an allocator cap "
                     "per rank); the Trainer's runs have none")
    return "\n".join(lines)
