"""One family surface's search, trial by trial: what the sampler asked, why, what the
surface answered, and what the cost model believed of the surface's best configurations
at each ask. For diagnosing a surface where the search is slow (issue 34, drawn-0).

    python tests/benchmarks/surface_replay/trace_seed.py --family gpt-1b-8gpu \
        --surface drawn-0 --seeds 3,0 --hours 1.2

Each launched trial's line: simulated hours, status, its noise-free share of the best,
its true peak and measured peak (GiB), the estimator's raw peak, the pick's reason
(`guided_by`; "fallback" for TPE's, "queued" for an enqueued one), then for each of the
`--watch` best configurations of the surface the cost model's corrected peak (GiB) and
its prior (samples/s; 0: predicted over the memory budget), and the memory correction
(runtime GiB, tensor ratio). Every `--dump`-th ask it also prints the step parts'
weights (part_fit) and, per watched configuration, the estimator's raw samples/s, the
prior and the surrogate's factor and sd over it. The search is `harness tune`'s code
(surface_replay.harness_run.run_seed), observed by wrapping two methods; nothing in
harness/ changes.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

GIB = 2**30


def short(plan: dict[str, Any]) -> str:
    """A plan in one line: layout, micro-batch, each strategy's non-default settings."""
    lay = plan["layout"]
    bits = [f"d{lay['data']}p{lay['pipeline']}t{lay['tensor']}",
            f"mb{plan['micro_batch_size']}"]
    for name, settings in sorted((plan.get("strategies") or {}).items()):
        keep = {k: v for k, v in (settings or {}).items()
                if k in ("stage", "every", "compile", "optimizer", "schedule", "dtype")}
        bits.append(name + (":" + ",".join(f"{k}={v}" for k, v in sorted(keep.items()))
                            if keep else ""))
    return " ".join(bits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gpt-1b-8gpu")
    p.add_argument("--surface", default="drawn-0")
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--hours", type=float, default=1.0, help="trace trials started before this")
    p.add_argument("--watch", type=int, default=3, help="distinct best configurations watched")
    p.add_argument("--dump", type=int, default=12, help="print the fits every this many asks")
    p.add_argument("--oracle-gemm", action="store_true",
                   help="the estimator's compute at the surface's GEMM efficiency "
                        "(world.gemm_oracle, as search_replay.py --oracle-gemm)")
    args = p.parse_args()

    import training_harness.tune.search.guided_sampler as guided
    from tests.benchmarks.surface_replay import family_run
    from tests.benchmarks.surface_replay import launcher as launcher_module
    from tests.benchmarks.surface_replay.harness_run import EPOCH, HOUR, run_seed
    from tests.benchmarks.surface_replay.others import enumerate_space
    from tests.benchmarks.surface_replay.world import gemm_oracle
    from tests.benchmarks.surfaces.family import surface

    setup, given = family_run._setup(args.family)
    s = surface(args.family, args.surface)
    setup.surface, setup.truth = s, s.truth
    setup.helper.adjust = gemm_oracle(s.assumptions) if args.oracle_gemm else None
    truth = enumerate_space(setup.checked.space, s.truth, setup.checked.budget_bytes, given)
    setup.size, setup.best, setup.goal = len(truth.plans), truth.best, 0.97 * truth.best
    watch: list[int] = []
    for i in sorted(range(len(truth.rates)), key=lambda j: -truth.rates[j]):
        if len(watch) >= args.watch:
            break
        if all(short(truth.plans[i]) != short(truth.plans[j]) for j in watch):
            watch.append(i)
    print(f"{args.family} {args.surface}: best {truth.best:.1f} samples/s, memory budget "
          f"{setup.checked.budget_bytes / GIB:.1f} GiB; watched:")
    for n, i in enumerate(watch):
        peak = s.truth(truth.plans[i])["peak_memory_bytes"] / GIB
        print(f"  W{n} share {truth.rates[i] / truth.best:.3f} true peak {peak:.1f} GiB "
              f"{short(truth.plans[i])}")

    why: dict[str, str] = {}
    asks = [0]
    choose = guided.GuidedSampler._choose

    def traced_choose(self: Any, study: Any) -> Any:
        out = choose(self, study)
        model = self.cost_model
        why["pick"] = "fallback" if out is None else out[1]
        now = model._now
        beliefs = []
        for i in watch:
            _, predicted = model.predictions.raw(truth.params[i])
            peak = now.peak_memory(predicted) or 0.0
            beliefs.append(f"{peak / GIB:.1f}/{model.prior(truth.params[i]) or 0:.0f}")
        why["watch"] = (" ".join(beliefs) + f" rt {now.runtime_bytes / GIB:.2f} "
                        f"ratio {now.memory_ratio:.3f}")
        asks[0] += 1
        if asks[0] % args.dump == 0:
            _dump(self, study, model, truth, watch)
        return out

    launch = launcher_module.SurfaceLauncher.launch

    def traced_launch(self: Any, prepared: Any, out_dir: Any, command: str, **kw: Any) -> Any:
        start = (self.clock.now - EPOCH) / HOUR
        r = launch(self, prepared, out_dir, command, **kw)
        if start <= args.hours:
            t = s.truth(r.plan)
            measured = (r.metrics or {}).get("peak_memory_bytes") or 0
            raw = (prepared.predicted or {}).get("peak_memory_bytes") or 0
            print(f"{start:5.2f}h {r.status:7s} share {t.get('samples_per_s', 0) / truth.best:.3f}"
                  f" peak true {t['peak_memory_bytes'] / GIB:5.1f} measured "
                  f"{measured / GIB:5.1f} raw {raw / GIB:5.1f} | {short(r.plan)} | "
                  f"{why.get('pick', 'queued')[:48]} | W {why.get('watch', '')}", flush=True)
        why.clear()
        return r

    guided.GuidedSampler._choose = traced_choose
    launcher_module.SurfaceLauncher.launch = traced_launch
    for seed in (int(x) for x in args.seeds.split(",")):
        print(f"=== seed {seed}", flush=True)
        run = run_seed(setup, seed)
        reached = f"{run.reached_s / HOUR:.2f} h" if run.reached_s else "missed"
        print(f"seed {seed}: 0.97 at {reached}, share at 1 h "
              f"{run.best_at(HOUR) / truth.best:.3f}, {run.launched} launched, {run.stopped}")


def _dump(sampler: Any, study: Any, model: Any, truth: Any, watch: list[int]) -> None:
    weights = {k: round(v, 2) for k, v in model._parts.weights().items()}
    print(f"   fit after {len(study.trials)} trials: part weights {weights}")
    observed, _ = sampler._observed(study.get_trials(deepcopy=False), 1.0)
    surrogate, belief = sampler._surrogate(observed, 1.0)
    for n, i in enumerate(watch):
        params = truth.params[i]
        plan, predicted = model.predictions.raw(params)
        mean, sd = surrogate.predict([model.features(params)])
        prior = model.prior(params) or 0.0
        raw = plan.batch_size / predicted["step_time_s"]
        print(f"   W{n}: true {truth.rates[i]:.1f} raw {raw:.1f}"
              f" prior {prior:.1f} surrogate x{math.exp(mean[0]):.2f} (sd {sd[0]:.2f} log)"
              f" -> {prior * math.exp(mean[0]):.1f}")
    if belief is not None:
        print(f"   the best measured, as the model believes it: {math.exp(belief):.1f}")


if __name__ == "__main__":
    main()
