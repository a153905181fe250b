"""Time to target of each technique that changes the maths against one AdamW baseline,
for docs/benchmarks: steps, samples and time to target over three seeds, and a verdict.

    HARNESS_CACHE_DIR=runs/ttl-techniques/cache \\
      python tests/benchmarks/time_to_loss_techniques.py --out runs/ttl-techniques \\
      [--only adamw,lars-5,...] [--remeasure 1]
    harness report runs/ttl-techniques      # the rows' curves and time-to-target table

Every row of the gpt section is the same workload, data, target, global batch and seeds
as its baseline (studies/time-to-loss-cpu.toml's at global batch 16: its lr needs no
scaling); the baseline's settings are held fixed and each technique gets only the small
sweep of its own settings listed in VARIANTS. Distillation's teacher and LoRA's starting
weights are trained first by `harness bench --save` (saved()). LoRA's section fine-tunes
one saved Llama against full fine-tuning of it, to the same target. The gpt-ddp section
is the gpt's on 2 data ranks (gloo, micro-batch 8): DDP's PowerSGD compression against
plain DDP (its runs to the target in one process, strategies.ddp.alone). Each row is one
`harness bench` trial with a [target] table (three runs to the target, then
WINDOW_STEPS measured steps); a trial measured while the machine was busy is measured
again (steps from the cache), as time_to_loss_table.py does.

Verdict against the section's baseline, on time to target: each row's range is its
seeds' (min-max) widened by its step time's p10/p90 over the median; "sooner beyond the
spread" where this row's range ends before the baseline's begins, "later beyond the
spread" the other way round, "within the spread" where they overlap, "missed" where a
seed did not reach the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from time_to_loss_table import (  # noqa: E402
    _seen,
    convergence_cells,
    measure_until_quiet,
    quietest,
)

STUDY = "studies/time-to-loss-cpu.toml"
BATCH = 16
# The distillation teacher: a gpt twice as deep and wide as the student, trained on the
# same corpus's training split for TEACHER_STEPS steps (`harness bench --save`).
TEACHER = {"layers": 4, "heads": 4, "hidden": 128}
TEACHER_STEPS = 1500
# LoRA's rows fine-tune one saved model (a Llama of the student's size, pretrained on the
# corpus for BASE_STEPS steps, to a loss above the target): full fine-tuning against LoRA.
LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256,
         "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 256}
BASE_STEPS = 110
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# label -> (what it is, the strategies, the lr, its section). Each section's baseline first.
VARIANTS: dict[str, tuple[str, dict[str, Any], float, str]] = {
    "adamw": ("AdamW (baseline)", {}, 1e-3, "gpt"),
    "lars-5": ("LARS, lr 5", {"lars": {}}, 5.0, "gpt"),
    "lars-10": ("LARS, lr 10", {"lars": {}}, 10.0, "gpt"),
    "muon-1e-3": ("Muon, lr 1e-3", {"muon": {}}, 1e-3, "gpt"),
    "muon-3e-3": ("Muon, lr 3e-3", {"muon": {}}, 3e-3, "gpt"),
    "ema-0.95": ("AdamW + EMA, decay 0.95", {"averaging": {"decay": 0.95}}, 1e-3, "gpt"),
    "ema-0.99": ("AdamW + EMA, decay 0.99", {"averaging": {"decay": 0.99}}, 1e-3, "gpt"),
    "curriculum-2048": ("AdamW + curriculum 16→64 over 2048 samples",
                        {"curriculum": {"start": 16, "samples": 2048}}, 1e-3, "gpt"),
    "curriculum-8192": ("AdamW + curriculum 16→64 over 8192 samples",
                        {"curriculum": {"start": 16, "samples": 8192}}, 1e-3, "gpt"),
    "distill-0.5": ("AdamW + distillation, weight 0.5, T 2",
                    {"distill": {"weight": 0.5, "temperature": 2.0}}, 1e-3, "gpt"),
    "distill-0.9": ("AdamW + distillation, weight 0.9, T 2",
                    {"distill": {"weight": 0.9, "temperature": 2.0}}, 1e-3, "gpt"),
    # blocks of 16 positions (flex's 128 would be one block at 64 positions): the counted
    # FLOPs are the blocks computed; on the CPU a dense mask runs every block all the same
    "sparse-16": ("AdamW + sliding-window attention, window 16 of 64",
                  {"sparse_attention": {"window": 16, "block": 16}}, 1e-3, "gpt"),
    "sparse-32-g4": ("AdamW + sliding-window attention, window 32 of 64, 4 global tokens",
                     {"sparse_attention": {"window": 32, "global_tokens": 4, "block": 16}},
                     1e-3, "gpt"),
    "full-ft": ("full fine-tuning, AdamW (baseline)", {}, 1e-3, "llama-ft"),
    "lora-8": ("LoRA rank 8 on q_proj, v_proj", {"lora": {"rank": 8, "alpha": 16}}, 1e-3,
               "llama-ft"),
    "lora-16-all": ("LoRA rank 16 on every linear",
                    {"lora": {"rank": 16, "alpha": 32, "target_modules": ALL_LINEARS}}, 1e-3,
                    "llama-ft"),
    # the gpt rows' maths on 2 gloo ranks of micro-batch 8 (plan_for): plain DDP, whose
    # steps to target are AdamW's (the cache's), against DDP's PowerSGD compression
    "ddp": ("AdamW, DDP on 2 ranks (baseline)", {"ddp": {}}, 1e-3, "gpt-ddp"),
    "powersgd-2-from-2": ("AdamW + DDP PowerSGD rank 2, from step 2",
                          {"ddp": {"compression": "powersgd", "powersgd_rank": 2,
                                   "start_powersgd_iter": 2}}, 1e-3, "gpt-ddp"),
    "powersgd-2-from-100": ("AdamW + DDP PowerSGD rank 2, from step 100",
                            {"ddp": {"compression": "powersgd", "powersgd_rank": 2,
                                     "start_powersgd_iter": 100}}, 1e-3, "gpt-ddp"),
    "powersgd-4-from-2": ("AdamW + DDP PowerSGD rank 4, from step 2",
                          {"ddp": {"compression": "powersgd", "powersgd_rank": 4,
                                   "start_powersgd_iter": 2}}, 1e-3, "gpt-ddp"),
}
BASELINES = {"gpt": "adamw", "llama-ft": "full-ft", "gpt-ddp": "ddp"}
WINDOW_STEPS = 64


def base_plan():
    """The study's plan at global batch 16, micro-batch 16, its [target] and seeds."""
    from training_harness.study.search_space import SearchSpace
    from training_harness.study.study_file import Study

    study = Study.from_toml(STUDY)
    space = SearchSpace.of(study, study.device)
    for params in space.enumerate():
        plan = space.plan(params)
        if (plan.batch_size == BATCH and plan.micro_batch_size == BATCH
                and not set(plan.strategies)):
            return plan
    raise SystemExit(f"{STUDY} has no AdamW plan at global batch {BATCH}")


def saved(out: Path, what: str) -> Path:
    """The teacher (`what` = "teacher") or the fine-tuning's start ("base"), trained by
    one `harness bench --save` trial the first time, then kept in `out`."""
    folder = (out / what).resolve()
    if (folder / "harness-saved.toml").is_file():
        return folder
    plan = base_plan().replace(name=f"ttl-{what}", target=None)
    if what == "teacher":
        plan = plan.replace(workload_args={**plan.workload_args, **TEACHER},
                            steps=TEACHER_STEPS)
    else:
        args = {**LLAMA, "seq_len": plan.workload_args["seq_len"], "data": "text"}
        plan = plan.replace(workload="hf:llama", workload_args=args, steps=BASE_STEPS)
    trial = out / "saved-trials" / what  # below the rows: not in their report
    trial.mkdir(parents=True, exist_ok=True)
    (trial / "plan.toml").write_text(plan.to_toml())
    print(f"[{what}] training {plan.steps} steps, then saved to {folder}", flush=True)
    subprocess.run([sys.executable, "-m", "training_harness", "bench", str(trial / "plan.toml"),
                    "--out", str(trial), "--save", str(folder)], check=True)
    return folder


def plan_for(label: str, out: Path):
    _, strategies, lr, section = VARIANTS[label]
    strategies = {k: dict(v) for k, v in strategies.items()}
    plan = base_plan()
    if "distill" in strategies:
        strategies["distill"]["teacher"] = str(saved(out, "teacher"))
    if section == "gpt-ddp":  # two data ranks of half the batch (harness bench forks them)
        from training_harness.core.plan import Layout

        plan = plan.replace(layout=Layout(data=2), micro_batch_size=BATCH // 2)
        start = strategies["ddp"].get("start_powersgd_iter")
        if start:  # the measured window after PowerSGD's warm-up: compressed steps
            plan = plan.replace(warmup_steps=max(plan.warmup_steps, start + 2))
    if section == "llama-ft":
        plan = plan.replace(workload=f"hf:{saved(out, 'base')}",
                            workload_args={"seq_len": plan.workload_args["seq_len"],
                                           "data": "text"})
    # a longer measured window than the study's 8 steps: step-time medians that hold
    # still between rows (the steps to target come from the cache, whatever the window)
    plan = plan.replace(name=f"ttl-{label}", strategies=strategies, steps=WINDOW_STEPS)
    plan.optimizer.lr = lr
    return plan


def run(label: str, out: Path, remeasure: int) -> dict | None:
    folder = out / label
    measure_until_quiet(folder, plan_for(label, out), remeasure, f"[{label}]", "3600")
    return quietest(folder) if (folder / "result.json").is_file() else None


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def spread(r: dict) -> list[float] | None:
    """The time to target's range over seeds, widened by the step time's own p10-p90
    (relative to its median): the seeds' spread and the measurement's together."""
    conv = r["metrics"].get("convergence") or {}
    if not conv.get("reached"):
        return None
    lo, hi = conv["time_spread_s"]
    st = r["metrics"].get("step_time_s") or {}
    if st.get("median") and st.get("p10") and st.get("p90"):
        lo, hi = lo * st["p10"] / st["median"], hi * st["p90"] / st["median"]
    return [lo, hi]


def verdict(row: dict, base: dict) -> str:
    mine, theirs = spread(row), spread(base)
    if mine is None:
        return "missed"
    if theirs is None:
        return "reached (the baseline missed)"
    if mine[1] < theirs[0]:
        return "sooner beyond the spread"
    if mine[0] > theirs[1]:
        return "later beyond the spread"
    return "within the spread"


def table(rows: dict[str, dict]) -> str:
    """One markdown table per section (the gpt's techniques; LoRA against full
    fine-tuning), each row against its section's baseline."""
    out = []
    for section, baseline in BASELINES.items():
        mine = {k: r for k, r in rows.items() if VARIANTS[k][3] == section}
        if not mine:
            continue
        lines = ["| technique | step time | peak memory (RSS) | predicted peak | steps to "
                 "target, median [min–max] | samples to target | time to target, median "
                 "[min–max over seeds] | verdict | busy |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        base = mine.get(baseline)
        for label, r in mine.items():
            lines.append(_row(label, r, base, label == baseline))
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _row(label: str, r: dict, base: dict | None, is_baseline: bool) -> str:
    m = r["metrics"]
    conv = m.get("convergence") or {}
    seen = _seen(r)
    share = seen.get("other_cpu_share")
    busy_cell = ("" if not seen.get("flagged") else
                 f"others {share:.0%}" if share is not None else f"load {m.get('load')}")
    cell_steps, cell_time, samples = convergence_cells(conv, lambda t: f"{t:.1f} s")
    step = conv.get("step_time_s")
    peak = m.get("peak_memory_bytes")
    guess = (r.get("predicted") or {}).get("peak_memory_bytes")
    mark = "baseline" if is_baseline else verdict(r, base) if base else "—"
    return (f"| {VARIANTS[label][0]} | {f'{step * 1000:.1f} ms' if step else '—'} | "
            f"{f'{peak / 2**20:.0f} MiB' if peak else '—'} | "
            f"{f'{guess / 2**20:.1f} MiB' if guess else '—'} | {cell_steps} | {samples} | "
            f"{cell_time} | {mark} | {busy_cell} |")


def steps_only(label: str, out: Path, steps: int = 20) -> dict:
    """In this process with one intra-op thread (two spin-wait on a loaded 2-core machine:
    steps of seconds instead of tens of ms): each seed's run to the target, through the
    shared cache, and the median of `steps` timed steps; a record shaped as bench's."""
    import torch

    from training_harness.core.target import maths_key
    from training_harness.measure import target_cache
    from training_harness.measure.convergence import train_to_target
    from training_harness.measure.time_to_target import summarize
    from training_harness.strategies.compose import compose, resolved
    from training_harness.workloads import load_workload

    torch.set_num_threads(1)
    # settings written out in full, as bench records a plan: the same maths key
    plan = resolved(plan_for(label, out))
    workload = load_workload(plan.workload, plan.workload_args)
    runs = []
    for seed in plan.target.seeds:
        key = maths_key(plan.to_dict(), seed, "cpu")
        run_ = target_cache.lookup(key)
        if run_ is None:
            run_ = train_to_target(plan, workload, torch.device("cpu"), None, seed)
            target_cache.store(key, run_)
        runs.append(run_)
        print(f"[{label}] seed {seed}: {run_['steps_to_target']} steps", flush=True)
    torch.manual_seed(0)
    setup = compose(workload.build_model(), plan.replace(target=None), "cpu")
    times = []
    for s in range(steps + 2):
        batch = workload.batch(plan.batch_size, s, "cpu")
        t0 = time.perf_counter()
        setup.step([batch], workload.loss)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[2:])
    length_times = None
    if setup.length_schedule is not None:  # the curriculum: each length's step time
        from training_harness.measure import length_times as lt

        batches = [[workload.batch(plan.batch_size, s, "cpu")] for s in range(4)]
        length_times = lt.time_lengths(setup, batches, workload.loss, torch.device("cpu"),
                                       lt.lengths_to_time(setup.length_schedule), steps)
    conv = summarize(runs, step_s, plan.target.loss, plan.to_dict(), length_times)
    return {"plan": plan.to_dict(), "metrics": {"convergence": conv, "load": load(),
            "interference": {"flagged": True, "other_cpu_share": None}}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--only", default="", help="these labels, e.g. adamw,lars-5")
    p.add_argument("--steps-only", action="store_true",
                   help="no bench trial: runs to the target and a step time in this "
                        "process, one thread (see steps_only)")
    p.add_argument("--remeasure", type=int, default=1,
                   help="times a trial measured on a busy machine is measured again")
    args = p.parse_args()
    labels = [x for x in args.only.split(",") if x] or list(VARIANTS)
    rows = {}
    for label in labels:
        if args.steps_only:
            r = steps_only(label, args.out)
            (args.out / label).mkdir(parents=True, exist_ok=True)
            (args.out / label / "steps-only.json").write_text(json.dumps(r, default=str))
        else:
            r = run(label, args.out, args.remeasure)
        if r is not None:
            rows[label] = r
    text = table(rows)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "rows.json").write_text(json.dumps(
        {k: v["metrics"].get("convergence") for k, v in rows.items()}, default=str))
    print(text)


if __name__ == "__main__":
    main()
