"""How wrong the estimator's raw prediction is on one family surface, by factor: truth over
prediction (noise-free samples/s over the estimator's, before any correction) on a seeded
sample of the space, its median per factor (tune.model.step_fit.factors), and where the
surface's best configurations rank in the estimator's order.

    OMP_NUM_THREADS=1 python tests/benchmarks/surface_replay/prior_error.py \
        --family gpt2-small-1gpu --surface base --sample 3000
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gpt2-small-1gpu")
    p.add_argument("--surface", default="base")
    p.add_argument("--sample", type=int, default=3000, help="configurations drawn (seed 0)")
    p.add_argument("--least", type=int, default=20, help="factors seen fewer times not shown")
    args = p.parse_args()

    from tests.benchmarks.surface_replay import family_run
    from tests.benchmarks.surface_replay.others import enumerate_space, predicted_rates
    from tests.benchmarks.surfaces.family import surface
    from training_harness.tune.model.step_fit import factors

    setup, given = family_run._setup(args.family)
    s = surface(args.family, args.surface)
    space = enumerate_space(setup.checked.space, s.truth, setup.checked.budget_bytes, given)
    near = {i for i, r in enumerate(space.rates) if r >= 0.97 * space.best}
    drawn = random.Random(0).sample(range(len(space.plans)), min(args.sample, len(space.plans)))
    predicted = predicted_rates(setup, space, sorted(set(drawn) | near))
    rows = [(i, rate, space.rates[i]) for i, rate in predicted.items() if space.rates[i] > 0]
    order = sorted(rows, key=lambda r: -r[1])
    ranks = [n for n, (i, _, _) in enumerate(order) if i in near]
    best = max(rows, key=lambda r: r[2])
    print(f"{args.family} {args.surface}: {len(space.plans)} configurations, best "
          f"{space.best:.1f} samples/s (predicted {best[1]:.1f}); {len(rows)} ok and predicted "
          f"to fit ({len(near)} within 0.97 of the best added to the sample)")
    ahead = sum(1 for _, rate, _ in rows if rate >= best[1])
    print(f"predicted at or above the best's prediction: {ahead}; the first within 0.97 "
          f"ranks {ranks[0] if ranks else None} in the estimator's order")
    by_factor: dict[str, list[float]] = defaultdict(list)
    for i, rate, truth in rows:
        for name in factors(space.plans[i]):
            by_factor[name].append(math.log(truth / rate))
    print(f"{'factor':44s} {'n':>6s} truth/prediction (median)")
    for name, logs in sorted(by_factor.items()):
        if len(logs) >= args.least:
            print(f"{name:44s} {len(logs):6d} {math.exp(statistics.median(logs)):.2f}")


if __name__ == "__main__":
    main()
