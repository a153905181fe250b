"""The selftest's page: docs/benchmarks/gpu_<device>_<date>.md, from selftest.json and
the files its steps left in the out folder (junit files, result.json, trials.jsonl)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from training_harness.core.units import format_bytes
from training_harness.records.predicates import HOST_BOUND_BELOW_PCT, host_bound_note
from training_harness.selftest.figures import (
    bench_figures,
    env_facts,
    junit_counts,
    num,
    read_json,
    read_jsonl,
    tune_figures,
)

TESTS_SUITES = {"gpu": "`pytest -m \"gpu and not slow\"`", "kernels": "`pytest tests/kernels`",
               "gpu-slow": "`pytest -m \"gpu and slow\"`"}


def pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def tflops(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e12:,.0f} TFLOP/s" if x >= 1e13 else f"{x / 1e9:,.1f} GFLOP/s"


def short(command: str | None) -> str:
    """The command with its interpreter's path written `python`."""
    return re.sub(r"^\S*python[0-9.]*(?=\s)", "python", command or "-")


def last_words(path: Path) -> str:
    """The last line a step printed (its error, as a rule), without the runner's own."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    said = [line for line in lines if line and not line.startswith("[selftest]")]
    return said[-1][:300] if len(said) > 1 else ""


def secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min"


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def spread(step: dict[str, Any]) -> str:
    if step.get("median") is None:
        return "-"
    return f"{ms(step['median'])} [{ms(step.get('p10'))}, {ms(step.get('p90'))}] (n={step['n']})"


def relative_spread(step: dict[str, Any]) -> float | None:
    """(p90 - p10) / median of the step times (the target is 5% at most)."""
    p10, p90, median = step.get("p10"), step.get("p90"), step.get("median")
    return (p90 - p10) / median if None not in (p10, p90) and median else None


REFERENCE = "gpt2-small-bf16"  # most plans named gpt2-small-* change one thing of it
# plan -> (the one change, the plan it changes)
CHANGED = {
    "gpt2-small-linear-ce": ("fused linear cross-entropy", REFERENCE),
    "gpt2-small-sliding-window": ("sliding-window attention, 1/4 of 1024", REFERENCE),
    "gpt2-small-sdpa-cudnn": ("SDPA on cuDNN attention", REFERENCE),
    "gpt2-small-flex": ("FlexAttention", REFERENCE),
    "gpt2-small-float8-tensorwise": ("float8, tensorwise", REFERENCE),
    "gpt2-small-float8-rowwise": ("float8, rowwise", REFERENCE),
    "gpt2-small-cuda-graphs": ("CUDA graphs (compile reduce-overhead)", REFERENCE),
    "gpt2-small-4096-sliding-window": ("sliding-window attention, 1/8 of 4096",
                                       "gpt2-small-4096-bf16"),
    "llama-1b-liger": ("Liger Kernel", "llama-1b-bf16"),
}


def against_reference(ran: list[tuple[dict[str, Any], dict[str, Any] | None]]) -> list[str]:
    """Each plan that changes one thing against the plan it changes, or why not."""
    by_name = {e["name"]: r for e, r in ran}
    lines: list[str] = []
    for reference in dict.fromkeys(ref for _, ref in CHANGED.values()):
        changed = [(n, what) for n, (what, ref) in CHANGED.items()
                   if ref == reference and n in by_name]
        if not changed:
            continue
        ref = by_name.get(reference)
        ref_rate = bench_figures(ref)["samples_per_s"] if ref else None
        lines += [f"Against `{reference}` ({rate(ref_rate)} samples/s), one change each:", ""]
        for name, what in changed:
            record = by_name[name]
            if record is None:
                lines.append(f"- {what}: no record (see the bench's log)")
                continue
            f = bench_figures(record)
            if f["status"] != "ok":
                lines.append(f"- {what}: {f['status']}: {cell(f['reason'] or '-')}")
            elif ref_rate:
                memory = (f", peak memory {format_bytes(f['memory'])}" if f["memory"] else "")
                lines.append(f"- {what}: {rate(f['samples_per_s'])} samples/s, "
                             f"**{f['samples_per_s'] / ref_rate:.2f}x**{memory}")
            else:
                lines.append(f"- {what}: {rate(f['samples_per_s'])} samples/s; the plan it "
                             "changes has no ok record to compare with")
        lines.append("")
    return lines


def _records(out: Path, state: dict[str, Any]) -> list[dict[str, Any]]:
    found = [r for entry in get_plans(state)
             if entry.get("dir") and (r := read_json(out / entry["dir"] / "result.json"))]
    tune = state["phases"].get("tune") or {}
    if tune.get("dir"):
        found += read_jsonl(out / tune["dir"] / "trials.jsonl")
    return found


def get_plans(state: dict[str, Any]) -> list[dict[str, Any]]:
    return (state["phases"].get("bench") or {}).get("plans") or []


def environment(out: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The environment a trial recorded (an ok one first); NVML and torch's answers
    fill what no record holds."""
    records = sorted(_records(out, state), key=lambda r: r.get("status") != "ok")
    facts = {k: v for k, v in env_facts(records[0] if records else None).items() if v}
    device = state.get("device") or {}
    fallback = {"device_name": device.get("name"), "driver": device.get("driver"),
                "torch": device.get("torch"), "cuda": device.get("cuda"),
                "triton": device.get("triton"), "gpus": device.get("count")}
    found = {k: facts.get(k) or v for k, v in fallback.items()} | {
        "memory_bytes": device.get("memory_bytes")}
    if state.get("rehearsal"):  # the stand-in name, and the CPU it stands on
        on = facts.get("device_name")
        found["device_name"] = device.get("name") + (f" (on {on})" if on else "")
    return found


def header(out: Path, state: dict[str, Any], date: str) -> list[str]:
    env = environment(out, state)
    runs = state.get("runs") or []
    lines = [f"# GPU selftest: {env['device_name'] or 'CUDA device'}, {date}", "",
             "| | |", "| --- | --- |",
             f"| device | {env['device_name'] or '-'} x {env['gpus'] or '?'}"
             + (f" ({format_bytes(env['memory_bytes'])} each)" if env["memory_bytes"] else "")
             + " |",
             f"| driver | {env['driver'] or '-'} |", f"| torch | {env['torch'] or '-'} |",
             f"| CUDA | {env['cuda'] or '-'} |", f"| Triton | {env['triton'] or '-'} |"]
    for run in runs:
        lines.append(f"| command | `{cell(run.get('command'))}` ({', '.join(run['phases'])}; "
                     f"{secs(run.get('wall_s'))}, started {run.get('started_at', '?')}) |")
    total = sum(r.get("wall_s") or 0 for r in runs)
    lines += [f"| total wall time | {secs(total)} |", f"| out folder | `{out}` |", ""]
    if state.get("rehearsal"):
        lines += ["**A rehearsal on the CPU** (`--rehearse`): the device name is a stand-in and "
                  "the sizes are tiny; it checks that every phase runs and reports, and no "
                  "figure on this page is a GPU's.", ""]
    lines += unfinished(runs[-1] if runs else {})
    # the core of the proof; the report, the rest and the table are reported in their place
    missing = [p for p in ("tests", "bench", "tune") if p not in state["phases"]]
    if missing:
        lines += [f"Not run: {', '.join(missing)} (run `harness selftest --gpu --only "
                  f"{','.join(missing)} --out {out}` to add them to this page).", ""]
    return lines


def unfinished(run: dict[str, Any]) -> list[str]:
    """Which phases of the last run had not finished when the page was written (all of
    them, once it ends, unless it was stopped) and the box each had."""
    progress = run.get("progress") or {}
    boxes = run.get("boxes") or {}
    words = {"running": "running", "waiting": "not started", "stopped": "stopped midway",
             "not in this run": "not in this run (a longer --time-limit adds it)"}
    open_ = [f"{p} ({words.get(w, w)})" for p, w in progress.items() if w != "done"]
    if not open_:
        return []
    plan = ", ".join(f"{p} {secs(s)}" for p, s in boxes.items() if s)
    return [f"Not finished when this page was written: {', '.join(open_)}. Time boxes: "
            f"{plan or '-'}.", ""]


def tests_section(out: Path, state: dict[str, Any]) -> list[str]:
    lines = ["## Tests", "", "| suite | passed | failed | errors | skipped | time | exit |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    failing, notes = [], []
    for run in state["phases"]["tests"].get("runs") or []:
        name = TESTS_SUITES.get(run["name"], run["name"])
        if run.get("skipped"):
            lines.append(f"| {name} | - | - | - | - | - | skipped |")
            notes.append(f"{name} did not run: {run['skipped']}")
            continue
        step = run.get("step") or {}
        counts = junit_counts(out / run["junit"]) if run.get("junit") else None
        exit_text = "timeout" if step.get("timed_out") else str(step.get("rc"))
        cells = [counts[k] if counts else "?" for k in ("passed", "failed", "errors", "skipped")]
        lines.append(f"| {name} | {' | '.join(map(str, cells))} | {secs(step.get('seconds'))} "
                     f"| {exit_text} |")
        if counts is None:
            notes.append(f"{name}: no junit file; see `{step.get('log')}`")
            continue
        failing += counts["failing"]
        if step.get("log"):
            notes.append(f"{name}: `{short(step['command'])}`, log `{step['log']}`")
    lines.append("")
    if failing:
        lines += ["Failing:", ""] + [f"- `{t}`" for t in failing] + [""]
    return lines + [f"- {n}" for n in notes] + [""]


def bench_section(out: Path, state: dict[str, Any]) -> list[str]:
    bench = state["phases"]["bench"]
    plans = get_plans(state)
    ran = [(e, read_json(out / e["dir"] / "result.json")) for e in plans if e.get("dir")]
    skipped = [e for e in plans if e.get("skipped")]
    lines = ["## Bench", "",
             f"{len(plans)} plan(s) matched `{bench.get('pattern')}`: {len(ran)} run, "
             f"{len(skipped)} skipped. Step times in ms: median [p10, p90] (steps timed).", "",
             "| plan | status | samples/s | step time | p10-p90 spread | GPU busy | window "
             "| MFU (datasheet) | MFU (measured peak) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    memory = ["| plan | peak memory (allocated / reserved) | predicted | error "
              "| step time | predicted | error |", "| --- | --- | --- | --- | --- | --- | --- |"]
    sources, problems, host_bound = set(), [], []
    for entry, record in ran:
        if record is None:
            step = entry.get("step") or {}
            why = "timed out" if step.get("timed_out") else f"exit code {step.get('rc')}"
            said = last_words(out / step["log"]) if step.get("log") else ""
            lines.append(f"| {entry['name']} | no record | - | - | - | - | - | - | - |")
            problems.append(f"{entry['name']}: no result.json ({why}{': ' if said else ''}"
                            f"{cell(said)}); log `{step.get('log')}`")
            continue
        f = bench_figures(record)
        if f["status"] != "ok":
            problems.append(f"{entry['name']}: {f['status']}: {cell(f['reason'] or '-')}")
        win = f["window"]
        window = "-"
        if win and num(win.get("samples_per_s")) is not None:
            seconds = num(win.get("seconds"))
            window = (f"{rate(num(win['samples_per_s']))} over {win.get('steps', '?')} steps"
                      + (f", {seconds:.2f} s" if seconds is not None else ""))
        measured = (f"{pct(f['mfu_measured'])} of {tflops(f['measured_peak_flops'])}"
                    if f["mfu_measured"] is not None else "-")
        busy = f["gpu_busy"]
        if host_bound_note(record):
            host_bound.append(f"{entry['name']} ({busy:.0f}%)")
        lines.append(f"| {entry['name']} | {f['status']} | {rate(f['samples_per_s'])} | "
                     f"{spread(f['step'])} | {pct(relative_spread(f['step']))} | "
                     f"{'-' if busy is None else f'{busy:.0f}%'} | {window} | "
                     f"{pct(f['mfu_datasheet'])} | {measured} |")
        if f["datasheet_source"]:
            sources.add(f"{f['peak_dtype'] or '?'}: {f['datasheet_source']}")
        split = (f" ({format_bytes(f['allocated'])} / {format_bytes(f['reserved'])})"
                 if f["allocated"] is not None else "")
        memory.append(f"| {entry['name']} | {format_bytes(f['memory'])}{split} | "
                      f"{format_bytes(f['predicted_memory'])} | {pct(f['memory_error'], True)} "
                      f"| {ms(f['step_median'])} | {ms(f['predicted_step'])} | "
                      f"{pct(f['step_error'], True)} |")
    if host_bound:
        lines += ["", f"Host-bound (the GPU ran kernels under {HOST_BOUND_BELOW_PCT:.0f}% of "
                  "the window, NVML): " + ", ".join(host_bound) + ". Their steps wait on the "
                  "host's kernel launches: their speed and spread are the CPU's as much as "
                  "the GPU's, and differ between machines with the same GPU."]
    lines += ["", "Memory and step time (ms), measured against the estimator's prediction "
              "(error: (predicted - measured) / measured):", "", *memory, ""]
    lines += step_error_summary(ran, bench.get("profile"))
    lines += against_reference(ran)
    if sources:
        lines += ["Datasheet peaks: " + "; ".join(sorted(sources)) + ".", ""]
    if problems:
        lines += ["Not ok:", ""] + [f"- {p}" for p in problems] + [""]
    if skipped:
        lines += ["Skipped:", ""] + [f"- {e['name']}: {e['skipped']}" for e in skipped] + [""]
    return lines


def step_error_summary(ran: list[tuple[dict[str, Any], dict[str, Any] | None]],
                       profile: dict[str, Any] | None) -> list[str]:
    """The raw step-time error over the ok plans (median, p90, max of |error|), and whether
    their estimates used the device profile measured at the bench's start."""
    errors, profiled = [], 0
    for _, record in ran:
        if record is None or record.get("status") != "ok":
            continue
        f = bench_figures(record)
        if f["step_error"] is not None:
            errors.append(abs(f["step_error"]))
            profiled += any("device profile of" in a
                            for a in (record.get("predicted") or {}).get("assumptions") or [])
    if not errors:
        return []
    errors.sort()
    p90 = errors[min(len(errors) - 1, round(0.9 * (len(errors) - 1)))]
    step = (profile or {}).get("step") or {}
    measured = ("the device profile measured at the bench's start (`profile.json`, "
                f"{secs(step.get('seconds'))})" if step.get("rc") == 0
                else "no device profile (its measurement failed: `profile.log`)"
                if profile else "no device profile")
    return [f"Raw step-time error over {len(errors)} ok plan(s): median "
            f"{pct(errors[len(errors) // 2])}, p90 {pct(p90)}, max {pct(errors[-1])}; "
            f"{profiled} of them estimated with {measured}.", ""]


def _peaks(peaks: dict[str, Any]) -> list[str]:
    lines = ["| dtype | datasheet | measured | MFU divides by |", "| --- | --- | --- | --- |"]
    for dtype, p in sorted(peaks.items()):
        p = p if isinstance(p, dict) else {}
        sheet, meas = p.get("datasheet") or {}, p.get("measured") or {}
        lines.append(f"| {dtype} | {tflops(sheet.get('flops'))} ({cell(sheet.get('source', '-'))})"
                     f" | {tflops(meas.get('flops'))} ({cell(meas.get('source', '-'))}) | "
                     f"{p.get('used', '-')} |")
    return lines


def tune_section(out: Path, state: dict[str, Any]) -> list[str]:
    tune = state["phases"]["tune"]
    lines = ["## Tune", ""]
    if tune.get("skipped"):
        return lines + [f"Did not run: {tune['skipped']}", ""]
    step = tune.get("step") or {}
    folder = out / tune["dir"]
    unreadable: list[str] = []  # trials.jsonl's damaged lines, named on the page
    t = tune_figures(read_jsonl(folder / "trials.jsonl", unreadable),
                     read_json(folder / "study.json"))
    exit_text = ("timed out" if step.get("timed_out") else f"exit code {step.get('rc')}"
                 if step else "not finished when this page was written")
    lines += [f"`{short(step.get('command'))}`: {exit_text} after {secs(step.get('seconds'))}"
              f" (budget {secs(tune.get('budget_s'))}; stopped: {t['stopped_because'] or '-'})."
              f" Log `{step.get('log')}`.", ""]
    if tune.get("note"):
        lines += [tune["note"], ""]
    if unreadable:
        lines += [f"- {note}" for note in unreadable] + [""]
    by_status = ", ".join(f"{n} {s}" for s, n in t["by_status"].items()) or "none"
    by_phase = ", ".join(f"{n} {p}" for p, n in t["by_phase"].items())
    lines += [f"Trials: {t['n']} ({by_status}; by phase: {by_phase or '-'}).", ""]
    best, base = t["best"], t["baseline"]
    rows = ["| | |", "| --- | --- |"]
    if best:
        f = best["figures"]
        rows += [f"| best | trial {best['trial_id']} ({best['phase']}): "
                 f"{rate(best['samples_per_s'])} samples/s"
                 + (f", {rate(f['tokens_per_s'])} tokens/s" if f["tokens_per_s"] else "")
                 + f", step {spread(f['step'])} ms |",
                 f"| its configuration | `{cell(best['config'])}` |",
                 f"| its MFU | {pct(f['mfu_datasheet'])} of the datasheet peak, "
                 f"{pct(f['mfu_measured'])} of the measured "
                 f"{tflops(f['measured_peak_flops'])} |"]
    else:
        rows.append("| best | no trial ran ok |")
    if base and base["samples_per_s"] is not None:
        rows.append(f"| fp32 baseline | trial {base['trial_id']}: "
                    f"{rate(base['samples_per_s'])} samples/s (`{cell(base['config'])}`) |")
    elif base:
        rows.append(f"| fp32 baseline | did not run ok: {base['status']}: "
                    f"{cell(base['reason'] or '-')} |")
    else:
        rows.append("| fp32 baseline | no baseline trial in trials.jsonl |")
    ratio = f"**{t['ratio']:.2f}x**" if t["ratio"] else "-"
    rows += [f"| tuned over fp32 baseline | {ratio} |",
             f"| estimator error, peak memory | {pct(t['memory_error'])} median "
             f"\\|predicted - measured\\| / measured over {t['memory_n']} measured trial(s)"
             f" (calibrated where calibrated; raw estimator {pct(t['memory_error_raw'])}) |",
             f"| estimator error, step time | {pct(t['step_error'])} over {t['step_n']} |",
             f"| step-time model error (corrected by the earlier trials) | "
             f"{pct(t['model_error'])} over {t['model_n']} |"]
    lines += rows + [""]
    for o in t["over_budget"]:
        lines += [f"Trial {o['trial_id']} ran at {rate(o['samples_per_s'])} samples/s but held "
                  f"{format_bytes(o['peak'])} of the device, over the memory budget of "
                  f"{format_bytes(t['memory_budget_bytes'])}: not a candidate for the best.",
                  ""]
    if t["peaks"]:
        lines += ["The study's fixed MFU denominators (study.json `peaks`):", "",
                  *_peaks(t["peaks"]), ""]
    report = tune.get("report") or {}
    if report.get("step"):
        rs = report["step"]
        ok = "written" if rs.get("rc") == 0 else f"failed (exit code {rs.get('rc')})"
        lines += [f"Report: `{report.get('html')}` {ok} (`{short(rs.get('command'))}`, "
                  f"log `{rs.get('log')}`).", ""]
    elif report.get("skipped"):
        lines += [f"Report: not made: {report['skipped']}.", ""]
    return lines


def table_section(out: Path, state: dict[str, Any]) -> list[str]:
    t = state["phases"]["table"]
    if t.get("skipped"):
        return ["## The GPU table for the search replay", "", f"Skipped: {t['skipped']}.", ""]
    step = t.get("step") or {}
    return ["## The GPU table for the search replay", "",
            f"`{t.get('study')}` into `{t.get('dir')}`: {t.get('after', 0)} configurations "
            f"measured ({t.get('ok', 0)} ok), {t.get('after', 0) - t.get('before', 0)} of "
            f"them this session; {t.get('records', 0)} records, those skipped for time "
            f"measured by a later session (`{short(step.get('command'))}`, exit code "
            f"{step.get('rc')}, log "
            f"`{step.get('log')}`). Replay it: `python tests/benchmarks/search_replay.py "
            f"--table {t.get('dir')}`.", ""]


def build(out: Path, state: dict[str, Any], date: str) -> str:
    lines = header(out, state, date)
    sections = {"tests": tests_section, "bench": bench_section, "tune": tune_section,
                "table": table_section}
    for phase in sections:  # in PHASES' order; the report is in the tune's section
        if phase in state["phases"]:
            lines += sections[phase](out, state)
    lines += versions_section(state)
    return "\n".join(lines).rstrip() + "\n"


def versions_section(state: dict[str, Any]) -> list[str]:
    """The installed dependencies the run saw, against the ranges declared (pyproject)."""
    rows = state.get("versions") or []
    if not rows:
        return []
    lines = ["## Versions", "", "| package | installed | tested range | extra |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {got or 'not installed'} | {spec} | {extra or 'core'} |"
              for name, got, spec, extra in rows]
    return [*lines, ""]
