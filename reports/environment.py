"""The environment the trials ran in (devices, versions), and what differs between trials."""

from __future__ import annotations

from collections import Counter
from typing import Any

from training_harness.reports.html import e, kv_table
from training_harness.reports.load import Run

SKIP = ("env",)  # environment variables of the trial process: not shown
FIRST = ("device", "device_name", "gpu_names", "driver", "cuda", "hip", "cudnn", "nccl", "torch",
         "python", "harness", "git", "cpu", "cpu_capability", "cpu_flags", "cpu_count",
         "hostname", "platform")


def flat_env(env: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if not isinstance(env, dict):
        return out
    for k, v in env.items():
        if not prefix and k in SKIP:
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict) and k != "gpus":
            out.update(flat_env(v, name + "."))
        elif k == "gpus" and isinstance(v, list):
            out[name] = f"{len(v)} device(s)"
        elif isinstance(v, list):
            out[name] = ", ".join(map(str, v)) or "none"
        else:
            out[name] = "–" if v is None else str(v)
    return out


def environment(run: Run) -> list[tuple[str, str, Counter]]:
    """(key, value of the best or first trial, Counter of values over all trials)."""
    envs = {tid: flat_env(r.get("env")) for tid, r in run.records.items()}
    if not envs:
        return []
    ref = envs.get(run.best_id or "") or next(iter(envs.values()))
    keys = sorted({k for env in envs.values() for k in env},
                  key=lambda k: (FIRST.index(k.split(".")[0]) if k.split(".")[0] in FIRST
                                 else len(FIRST), k))
    return [(k, ref.get(k, "–"), Counter(env.get(k, "–") for env in envs.values()))
            for k in keys]


def environment_rows(run: Run) -> str:
    rows = environment(run)
    if not rows:
        return '<p class="empty">No record holds an environment.</p>'
    varying = [(k, c) for k, _, c in rows if len(c) > 1]
    html = kv_table((k, v) for k, v, _ in rows)
    if varying:
        items = "".join(
            f"<li><b>{e(k)}</b>: " + "; ".join(f"{e(v)} ({n} trials)" for v, n in c.most_common(6))
            + "</li>" for k, c in varying[:30])
        html = (f'<p class="note">These differ between trials:</p><ul>{items}</ul>'
                '<p class="note">Values of the best (or first) trial:</p>' + html)
    return html
