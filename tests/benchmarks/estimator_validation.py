"""The estimator's raw step time against measured steps, with this machine's device profile.

    python tests/benchmarks/estimator_validation.py --out runs/estimator-cpu \\
        [--plans quickstart,mlp,...] [--rounds 3] [--page docs/benchmarks/estimator_cpu_DATE.md]

Nothing is fitted on the steps it is judged on: the profile comes from microbenchmarks
(`harness calibrate`, into --out's own cache), the steps from whole-model `harness bench`
trials of the plans in studies/plans/. The whole is done in rounds (ROUND/profile.json,
then ROUND/PLAN/ for each plan): a shared VM's speed moves by up to 30% over minutes, and
one 10-step trial of a small plan lands in one of its allocator's modes (mlp: 29-45 ms
from one trial to the next, on a quiet machine). A plan's error is the median of its
rounds' errors, each round's estimate judged against that round's trial. The page gives
each profile's best fp32 matmul rate, so that drift is seen. The estimates are made here,
from the plan and the round's profile.json (so a changed estimator is judged again
without measuring again: the trials and profiles in --out are reused); the estimate
without the profile (one peak per dtype at an assumed MFU) beside it. A trial measured
while the machine was busy is measured again (as time_to_loss_table.py does).

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
    ap.add_argument("--rounds", type=int, default=3,
                    help="profile, then every plan's trial, this many times over")
    ap.add_argument("--page", help="write the markdown page there")
    ap.add_argument("--remeasure", type=int, default=2)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    os.environ["HARNESS_CACHE_DIR"] = str(out / "cache")
    from training_harness.core.plan import Plan

    names = args.plans.split(",")
    plans = {n: Plan.from_toml(ROOT / "studies" / "plans" / f"{n}.toml") for n in names}
    rounds: list[dict[str, dict]] = []  # per round: plan -> its row
    profiles = []
    for k in range(args.rounds):
        folder = out / f"round{k + 1}"
        profile = measure_profile(folder)
        profiles.append(profile)
        rounds.append({})
        for name, plan in plans.items():
            measure_until_quiet(folder / name, plan, args.remeasure, f"[round {k + 1}: {name}]")
            record = quietest(folder / name)
            rounds[-1][name] = row(name, record, estimate_step(plan, record, None),
                                   estimate_step(plan, record, profile)) | {
                "matmul": best_matmul(profile), "load": load_of(folder)}
    rows = [combine_rounds([r[name] for r in rounds]) for name in names]
    page = render(rows, rounds, profiles, args)
    (out / "validation.md").write_text(page)
    if args.page:
        Path(args.page).write_text(page)
    print(page)
    return 0


def measure_profile(folder: Path) -> dict:
    """The round's profile (`harness calibrate`), measured unless the folder has it."""
    path = folder / "profile.json"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "training_harness", "calibrate", "--out",
                        str(path)], check=True)
        # the load while it was measured: its figures are bests of groups, slowed (never
        # sped up) by other work
        (folder / "profile-load.json").write_text(json.dumps(os.getloadavg()))
    return json.loads(path.read_text())


def combine_rounds(rows: list[dict]) -> dict:
    """One plan over the rounds: its median measured step, and each error as the median of
    the rounds' errors (each round's estimate against that round's trial, the profile
    measured minutes before it)."""
    ok = [r for r in rows if r["measured"]]
    combined = dict(rows[0])
    combined["measured"] = statistics.median(r["measured"] for r in ok) if ok else None
    for key in ("predicted", "plain"):
        errs = [r[key] / r["measured"] - 1 for r in ok if r[key]]
        combined[f"{key}_error"] = statistics.median(errs) if errs else None
        combined[key] = (combined["measured"] * (1 + combined[f"{key}_error"])
                         if errs else None)
    combined["interference"] = any(r["interference"] for r in rows)
    combined["rounds"] = rows
    return combined


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


def best_matmul(profile: dict) -> float:
    """The profile's best fp32 matmul rate, GFLOP/s: the machine's speed when measured."""
    return max(2 * m * n * k / t for m, n, k, t in profile["matmul"]["fp32"]) / 1e9


def load_of(folder: Path) -> float | None:
    """The 1-minute load average after the plan's profile was measured."""
    path = folder / "profile-load.json"
    return json.loads(path.read_text())[0] if path.is_file() else None


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
    return [r[f"{key}_error"] if f"{key}_error" in r else r[key] / r["measured"] - 1
            for r in rows if r["measured"] and r[key]]


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


def render(rows: list[dict], rounds: list[dict[str, dict]], profiles: list[dict],
           args: argparse.Namespace) -> str:
    first = profiles[0]
    rates = [best_matmul(p) for p in profiles]
    lines = [
        f"# The estimator's raw step time on the CPU, {time.strftime('%Y-%m-%d')}",
        "",
        f"Device: {first['device_name']}, {first['threads']} threads, torch "
        f"{first['torch']}. {len(rounds)} round(s): in each, the device profile measured by "
        "`harness calibrate` (microbenchmarks only), then every plan's steps measured by "
        "`harness bench` of studies/plans/ (median step of each trial; a trial measured "
        "beside other work is measured again), each estimated with that round's profile. "
        f"Profiles from {first['measured_at']} to {profiles[-1]['measured_at']}; their best "
        f"fp32 matmul {min(rates):.1f}-{max(rates):.1f} GFLOP/s (the machine's speed moving "
        "between rounds). A plan's error is the median of its rounds' errors. Load average "
        f"when this page was written: {[round(x, 2) for x in os.getloadavg()]}.",
        "",
        f"    python tests/benchmarks/estimator_validation.py --out {args.out} "
        f"--plans {args.plans} --rounds {args.rounds}",
        "",
        "| plan | measured step (median of rounds) | with the profile | error | each round "
        "| without (peak x MFU) | error |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        def ms(x: float | None) -> str:
            return f"{x * 1e3:.1f} ms" if x else "-"

        def err(x: float | None) -> str:
            return f"{x:+.0%}" if x is not None else "-"

        each = ", ".join(f"{ms(x['measured'])} {err(x['predicted'] / x['measured'] - 1)}"
                         if x["measured"] and x["predicted"] else "-" for x in r["rounds"])
        flag = " (busy)" if r["interference"] else ""
        lines.append(f"| {r['plan']}{flag} | {ms(r['measured'])} | {ms(r['predicted'])} "
                     f"| {err(r.get('predicted_error'))} | {each} | {ms(r['plain'])} "
                     f"| {err(r.get('plain_error'))} |")
    lines += ["", f"- With the profile: {summary(rows, 'predicted')}.",
              f"- Without (one peak per dtype at an assumed MFU): {summary(rows, 'plain')}.",
              ""]
    for k, rnd in enumerate(rounds):
        one = list(rnd.values())
        load = one[0]["load"]
        lines.append(f"- Round {k + 1} alone (profile's matmul {rates[k]:.1f} GFLOP/s, load "
                     f"{load if load is None else round(load, 2)}): "
                     f"{summary(one, 'predicted')}.")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
