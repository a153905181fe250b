"""The short tables `harness bench` and `harness estimate` print."""

from __future__ import annotations

from typing import Any

from training_harness.core.units import format_bytes, format_rate, format_seconds
from training_harness.records.predicates import (
    HOST_BOUND_WHY,
    busy_note,
    gpu_busy_pct,
    host_bound_note,
)


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def estimate_table(predicted: dict[str, Any]) -> str:
    memory = predicted.get("memory", {})
    rows = [(f"memory: {k}", format_bytes(v)) for k, v in memory.items() if v]
    rows.append(("peak memory", format_bytes(predicted["peak_memory_bytes"])))
    rows.append(("step time", format_seconds(predicted.get("step_time_s"))))
    out = _table(rows)
    for a in predicted.get("assumptions", []):
        out += f"\n  - {a}"
    return out


def result_table(record: dict[str, Any]) -> str:
    m, p = record["metrics"], record.get("predicted") or {}
    st = m["step_time_s"]
    reason, _, details = (record["reason"] or "").partition("\n")
    rows = [("status", record["status"] + (f" ({reason})" if reason else ""))]
    if st.get("median") is not None:
        rows += [
            ("step time", f"{format_seconds(st['median'])} median "
                          f"[p10 {format_seconds(st['p10'])}, p90 {format_seconds(st['p90'])}], "
                          f"n={st['n']}   predicted {format_seconds(p.get('step_time_s'))}"),
            ("throughput", f"{format_rate(m['samples_per_s'], 'samples/s')}"
                           + (f", {format_rate(m['tokens_per_s'], 'tokens/s')}"
                              if m.get("tokens_per_s") else "")
                           + (f"   (window of {m['window']['steps']} steps, "
                              f"{format_seconds(m['window']['seconds'])})"
                              if m.get("window") else "")),
            ("TFLOP/s per device", f"{m['tflops_per_device']:.4f}"),
            ("MFU", f"{100 * m['mfu']:.1f}% of {m['peak_flops_source']}"),
        ]
        seen = m.get("interference")
        if seen:
            busy = busy_note(record)
            rows.append(("machine", f"BUSY: {busy} during the measured steps; these figures "
                                    "are not the configuration's own, measure again when "
                                    "the machine is quiet" if busy else
                                    f"quiet (others used {seen['other_cpu_share']:.0%} of "
                                    "the CPUs during the measured steps)"))
        gpu_busy = gpu_busy_pct(record)
        if gpu_busy is not None:
            rows.append(("GPU busy", f"{gpu_busy:.0f}% of the window (NVML)"
                                     + (f"; HOST-BOUND: {HOST_BOUND_WHY}"
                                        if host_bound_note(record) else "")))
        warning = (m.get("peak_flops") or {}).get("warning")
        if warning:
            rows.append(("MFU warning", warning))
    rows.append(("peak memory", f"{format_bytes(m['peak_memory_bytes'])} measured, "
                                f"{format_bytes(p.get('peak_memory_bytes'))} predicted"))
    mem = m.get("memory") or {}
    if mem.get("device_held") is not None:  # what the peak is, on a GPU
        rows.append(("  on the device", f"{format_bytes(mem['allocated'])} allocated, "
                                        f"{format_bytes(mem['reserved'])} reserved, "
                                        f"{format_bytes(mem['device_held'])} held "
                                        f"({mem.get('device_held_source')})"))
    if mem.get("rss") is not None and mem.get("rss_base") is not None:
        rows.append(("  CPU RSS", f"{format_bytes(mem['rss'])} peak, "
                                  f"{format_bytes(mem['rss'] - mem['rss_base'])} above start"))
    if m.get("energy_j_per_sample") is not None:
        rows.append(("energy", f"{m['energy_j_per_sample']:.3f} J/sample"))
    loss = m["loss"]
    if loss.get("first") is not None:
        rows.append(("loss", f"{loss['first']:.4f} -> {loss['last']:.4f}"))
    rows += data_rows(m)
    table = _table(rows)
    if details:  # e.g. the last lines of a failing rank's stderr
        table += "\n" + "\n".join(f"    {line}" for line in details.splitlines())
    return table


def data_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    """Real data's wait (training_harness.measure.loader) and time to target
    (training_harness.measure.time_to_target), where the record has them."""
    rows = []
    data = m.get("data") or {}
    if data.get("loader") == "dataloader" and data.get("data_wait_share") is not None:
        rows.append(("data", f"{data['source']} through a DataLoader ({data['workers']} "
                             f"worker(s)): the measured steps waited "
                             f"{data['data_wait_share']:.1%} of the window for it"))
    conv = m.get("convergence")
    if conv:
        seeds = len(conv["runs"])
        if conv["reached"]:
            lo, hi = conv["time_spread_s"] or (None, None)
            spread = f", seeds {format_seconds(lo)} to {format_seconds(hi)}" if seeds > 1 else ""
            rows.append(("time to target", f"{format_seconds(conv['time_to_target_s'])} = "
                         f"{conv['steps_to_target']:g} steps x "
                         f"{format_seconds(conv['step_time_s'])} (validation loss "
                         f"{conv['target_loss']:g}, median of {seeds} seed(s){spread})"))
        else:
            rows.append(("time to target", f"NOT REACHED: best validation loss "
                         f"{conv['best_val_loss']:.4g} against {conv['target_loss']:g}"))
        lengths = conv.get("step_time_by_length_s")
        if lengths:  # the curriculum: the step time above is the run's mean step
            rows.append(("  step by length", "length " + ", ".join(
                f"{k}: {format_seconds(v)}" for k, v in
                sorted(lengths.items(), key=lambda kv: int(kv[0]))) + " (timed after the "
                f"window, linear between; {format_seconds(conv['step_time_s'])} is the "
                "run's mean step)"))
        cached = sum(bool(r.get("cached")) for r in conv["runs"])
        rows.append(("  steps from", f"{cached} cached, {seeds - cached} trained here"))
    return rows
