"""The estimator's raw step time against measured steps, with this machine's device profile.

    python tests/benchmarks/estimator_validation.py --out runs/estimator-cpu \\
        [--plans quickstart,mlp,...] [--page docs/benchmarks/estimator_cpu_DATE.md]

Nothing is fitted on the steps it is judged on: the profile comes from microbenchmarks
(`harness calibrate`, measured first, into --out's own cache), the steps from whole-model
`harness bench` trials of the plans in studies/plans/. The estimates are made here, from
the plan and --out's profile.json (so a changed estimator is judged again without
measuring again: the trials and the profile in --out are reused); the estimate without
the profile (one peak per dtype at an assumed MFU) beside it. A trial measured while the
machine was busy is measured again (as time_to_loss_table.py does).

Raw error = predicted / measured - 1 (negative: predicted fast). The page gives median,
p90 and max of |error|, the rank correlation of predicted and measured throughput
(Spearman), and the share of the measured best taken by the predicted best.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from time_to_loss_table import measure_until_quiet, quietest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLANS = ("quickstart", "amp-bf16", "checkpoint", "fused", "mlp", "resnet", "vit",
         "accumulation", "lamb", "gpt-medium")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/estimator-cpu")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--page", help="write the markdown page there")
    ap.add_argument("--remeasure", type=int, default=2)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    os.environ["HARNESS_CACHE_DIR"] = str(out / "cache")
    harness = [sys.executable, "-m", "training_harness"]
    if not (out / "profile.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([*harness, "calibrate", "--out", str(out / "profile.json")], check=True)
        # the machine's load while the profile was measured: its figures are bests of groups,
        # slowed (never sped up) by other work
        (out / "profile-load.json").write_text(json.dumps(os.getloadavg()))
    from training_harness.core.plan import Plan

    rows = []
    for name in args.plans.split(","):
        plan = Plan.from_toml(ROOT / "studies" / "plans" / f"{name}.toml")
        measure_until_quiet(out / name, plan, args.remeasure, f"[{name}]")
        record = quietest(out / name)
        profile = json.loads((out / "profile.json").read_text())
        rows.append(row(name, record, estimate_step(plan, record, None),
                        estimate_step(plan, record, profile)))
    page = render(rows, json.loads((out / "profile.json").read_text()), args,
                  json.loads(load.read_text()) if (load := out / "profile-load.json").is_file()
                  else None)
    (out / "validation.md").write_text(page)
    if args.page:
        Path(args.page).write_text(page)
    print(page)
    return 0


def estimate_step(plan, record: dict, profile: dict | None) -> float | None:
    """The step the estimator gives, with the trial's own peak, with `profile` or without."""
    from training_harness.core.device import RuntimeEnv
    from training_harness.estimator import estimate
    from training_harness.estimator.profiled_step import DeviceProfile
    from training_harness.workloads import load_workload

    workload = load_workload(plan.workload, plan.workload_args)
    return estimate(plan.replace(device="cpu"), workload, RuntimeEnv.detect("cpu"),
                    _peak(record), profile=DeviceProfile(profile) if profile else None
                    ).step_time_s


def _peak(record: dict) -> float | None:
    m = record["metrics"]
    if m.get("mfu") and m.get("tflops_per_device"):
        return m["tflops_per_device"] * 1e12 / m["mfu"]
    return None


def row(name: str, record: dict, plain: float | None, profiled: float | None) -> dict:
    return {"plan": name, "status": record["status"],
            "measured": record["metrics"]["step_time_s"]["median"],
            "predicted": profiled, "plain": plain,
            "samples_per_step": record["plan"].get("global_batch_size")
            or record["plan"].get("micro_batch_size"),
            "interference": bool(((record["metrics"].get("interference")) or {}).get("flagged"))}


def errors(rows: list[dict], key: str) -> list[float]:
    return [r[key] / r["measured"] - 1 for r in rows if r["measured"] and r[key]]


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def summary(rows: list[dict], key: str) -> str:
    e = sorted(abs(x) for x in errors(rows, key))
    if not e:
        return "no figures"
    p90 = e[min(len(e) - 1, round(0.9 * (len(e) - 1)))]
    ok = [r for r in rows if r["measured"] and r[key]]
    rate_m = [r["samples_per_step"] / r["measured"] for r in ok]
    rate_p = [r["samples_per_step"] / r[key] for r in ok]
    best = rate_m[rate_p.index(max(rate_p))] / max(rate_m)
    return (f"median {statistics.median(e):.1%}, p90 {p90:.1%}, max {e[-1]:.1%} "
            f"(n={len(e)}); rank correlation of throughput {spearman(rate_p, rate_m):.2f}; "
            f"predicted best takes {best:.2f} of the measured best")


def render(rows: list[dict], profile: dict, args: argparse.Namespace,
           load: list[float] | None) -> str:
    lines = [
        f"# The estimator's raw step time on the CPU, {time.strftime('%Y-%m-%d')}",
        "",
        f"Device: {profile['device_name']}, {profile['threads']} threads, torch "
        f"{profile['torch']}. Profile measured {profile['measured_at']} by `harness calibrate` "
        "(microbenchmarks only); steps measured by `harness bench` of studies/plans/ "
        "(median step of each trial; a trial measured beside other work is measured again).",
        f"Load average (1, 5, 15 min) after the profile: {load or 'not recorded'}; "
        f"when this page was written: {[round(x, 2) for x in os.getloadavg()]}.",
        "",
        f"    python tests/benchmarks/estimator_validation.py --out {args.out} "
        f"--plans {args.plans}",
        "",
        "| plan | measured step | with the profile | error | without (peak x MFU) | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        def ms(x: float | None) -> str:
            return f"{x * 1e3:.1f} ms" if x else "-"

        def err(key: str, r: dict = r) -> str:
            return f"{r[key] / r['measured'] - 1:+.0%}" if r["measured"] and r[key] else "-"

        flag = " (busy)" if r["interference"] else ""
        lines.append(f"| {r['plan']}{flag} | {ms(r['measured'])} | {ms(r['predicted'])} "
                     f"| {err('predicted')} | {ms(r['plain'])} | {err('plain')} |")
    lines += ["", f"- With the profile: {summary(rows, 'predicted')}.",
              f"- Without (one peak per dtype at an assumed MFU): {summary(rows, 'plain')}.",
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
