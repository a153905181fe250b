"""Is one configuration faster than another? A ratio of throughputs with a distribution-free
confidence interval, and a verdict: faster, slower, or not distinguishable at this n.

The one method every ratio the harness states uses (the best over the baseline, each
technique of the ablation, two studies in `harness compare`; docs/measuring.md):

- unpaired (two sets of measurements, e.g. every measurement of each configuration,
  pooled across phases): the Hodges-Lehmann estimate of the shift between their logs,
  the median of every log(a_i / b_j), with its distribution-free interval: from the
  k-th smallest to the k-th largest of those m x n log ratios, k from the exact
  Mann-Whitney distribution (Lehmann 1975, Nonparametrics, ch. 2; Hollander & Wolfe,
  Nonparametric Statistical Methods, 4.3). Mann-Whitney is the test asv and Google
  Benchmark compare results with.
- paired (MIN_PAIRS or more pairs, each taken close together: the two configurations
  in the same confirmation round or ablation repeat): the Hodges-Lehmann estimate of
  the pairs' log ratios, the median of their Walsh averages, with the interval from
  the exact Wilcoxon signed-rank distribution. A slow spell of the machine falls on
  both members of a pair, so drift between rounds leaves the interval alone.

Both intervals assume only that the measurements are independent and that the two
configurations' distributions differ by a shift of the log (a factor); they hold at
any n, and where n is too small for CONFIDENCE no interval is given. The verdict,
as criterion.rs makes it: "faster" only when the whole interval lies above
1 + NOISE_THRESHOLD, "slower" only when it lies below 1 / (1 + NOISE_THRESHOLD),
otherwise "not distinguishable at this n". Pure Python: the tuner and the report
import it without torch, numpy or scipy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass

CONFIDENCE = 0.95  # two-sided
NOISE_THRESHOLD = 0.02  # a factor within 2% either way is noise, whatever the interval
MIN_PAIRS = 6  # the fewest pairs whose signed-rank interval reaches 95% (2 / 2**6 < 0.05)

FASTER = "faster"
SLOWER = "slower"
SAME = "not distinguishable at this n"
UNTOLD = "too few measurements to tell"  # SAME where no interval reaches CONFIDENCE: said so


@dataclass(frozen=True)
class Ratio:
    """a over b: a's throughput as a multiple of b's."""
    estimate: float
    lo: float | None  # the interval, None where n is too small for CONFIDENCE
    hi: float | None
    confidence: float  # the interval's exact coverage (>= CONFIDENCE when given)
    method: str  # "pooled" (unpaired) or "paired"
    n_a: int  # measurements of a (pairs, when paired)
    n_b: int
    verdict: str  # FASTER, SLOWER or SAME

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def said(self) -> str:
        """The verdict in words: with no interval at all, too few to tell (not a tie)."""
        return UNTOLD if self.lo is None else self.verdict

    @property
    def interval(self) -> str:
        if self.lo is None or self.hi is None:
            return "no 95% interval at this n"
        return f"{CONFIDENCE:.0%} interval [{self.lo:.2f}, {self.hi:.2f}]"

    @property
    def basis(self) -> str:
        """What the interval rests on, in words."""
        if self.method == "paired":
            return f"{self.n_a} pairs of measurements taken close together"
        return f"{self.n_a} and {self.n_b} measurements"

    @property
    def method_text(self) -> str:
        if self.method == "paired":
            return ("Hodges-Lehmann estimate of the pairs' log ratios, Wilcoxon signed-rank "
                    "interval")
        return ("Hodges-Lehmann estimate of every pairwise log ratio, Mann-Whitney interval")

    def text(self) -> str:
        """'1.05x (95% interval [0.93, 1.18], 5 and 5 measurements): not distinguishable
        at this n'."""
        return f"{self.estimate:.2f}x ({self.interval}, {self.basis}): {self.said}"


def ratio(a: Sequence[float], b: Sequence[float],
          a_keys: Sequence[Hashable | None] | None = None,
          b_keys: Sequence[Hashable | None] | None = None) -> Ratio:
    """a's throughput over b's. `a_keys`/`b_keys` name each measurement's pairing (its
    round; None: unpaired); with MIN_PAIRS or more common keys the pairs decide."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if not a or not b or min(a + b) <= 0:
        raise ValueError("a ratio needs positive measurements of both")
    pairs = _pairs(a, b, a_keys, b_keys)
    if len(pairs) >= MIN_PAIRS:
        logs = [math.log(x / y) for x, y in pairs]
        est, lo, hi, conf = signed_rank_interval(logs)
        return _ratio(est, lo, hi, conf, "paired", len(pairs), len(pairs))
    est, lo, hi, conf = rank_sum_interval([math.log(x) for x in a], [math.log(y) for y in b])
    return _ratio(est, lo, hi, conf, "pooled", len(a), len(b))


def _pairs(a, b, a_keys, b_keys) -> list[tuple[float, float]]:
    if a_keys is None or b_keys is None:
        return []
    mine = {k: v for k, v in zip(a_keys, a, strict=True) if k is not None}
    theirs = {k: v for k, v in zip(b_keys, b, strict=True) if k is not None}
    return [(mine[k], theirs[k]) for k in mine if k in theirs]


def _ratio(est: float, lo: float | None, hi: float | None, conf: float, method: str,
           n_a: int, n_b: int) -> Ratio:
    verdict = SAME
    if lo is not None and hi is not None and conf >= CONFIDENCE:
        if lo > math.log1p(NOISE_THRESHOLD):
            verdict = FASTER
        elif hi < -math.log1p(NOISE_THRESHOLD):
            verdict = SLOWER
    given = lo is not None and conf >= CONFIDENCE
    return Ratio(math.exp(est), math.exp(lo) if given else None,
                 math.exp(hi) if given else None, conf, method, n_a, n_b, verdict)


def rank_sum_interval(x: Sequence[float], y: Sequence[float]
                      ) -> tuple[float, float | None, float | None, float]:
    """The Hodges-Lehmann shift x - y and its Mann-Whitney interval: (estimate, lo, hi,
    coverage); lo and hi are the full range where no interval reaches CONFIDENCE."""
    diffs = sorted(xi - yj for xi in x for yj in y)
    counts = _rank_sum_counts(len(x), len(y))
    return (statistics.median(diffs), *_order_interval(diffs, counts))


def signed_rank_interval(d: Sequence[float]) -> tuple[float, float | None, float | None, float]:
    """The Hodges-Lehmann location of `d` (median of Walsh averages) and its Wilcoxon
    signed-rank interval: (estimate, lo, hi, coverage)."""
    walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
    counts = _signed_rank_counts(len(d))
    return (statistics.median(walsh), *_order_interval(walsh, counts))


def _order_interval(sorted_values: list[float], counts: list[int]
                    ) -> tuple[float, float, float]:
    """[v_(k), v_(N+1-k)] (1-based) with k = c + 1 for the largest c whose tail
    P(U <= c) is at most (1 - CONFIDENCE) / 2 under the null (`counts[u]`: the ways to get
    u), and its coverage 1 - 2 P(U <= c); the full range, and its lower coverage, where
    no c is."""
    total = sum(counts)
    tail, c = 0, -1
    for u, ways in enumerate(counts):
        if (tail + ways) / total > (1 - CONFIDENCE) / 2:
            break
        tail += ways
        c = u
    if c < 0:  # too few measurements: the full range covers 1 - 2 P(U <= 0)
        return sorted_values[0], sorted_values[-1], max(0.0, 1 - 2 * counts[0] / total)
    return sorted_values[c], sorted_values[len(sorted_values) - 1 - c], 1 - 2 * tail / total


def _rank_sum_counts(m: int, n: int) -> list[int]:
    """The ways to get each Mann-Whitney U = 0..m*n under the null: the coefficients of
    the Gaussian binomial [m+n choose m](q) = prod_i (1 - q^(n+i)) / (1 - q^i)."""
    poly = [1] + [0] * (m * n)
    for i in range(1, m + 1):
        for u in range(m * n, n + i - 1, -1):  # times (1 - q^(n+i))
            poly[u] -= poly[u - n - i]
        for u in range(i, m * n + 1):  # divided by (1 - q^i)
            poly[u] += poly[u - i]
    return poly


def _signed_rank_counts(n: int) -> list[int]:
    """The ways to get each Wilcoxon W+ = 0..n(n+1)/2: the coefficients of prod (1 + q^i)."""
    top = n * (n + 1) // 2
    poly = [1] + [0] * top
    for i in range(1, n + 1):
        for w in range(top, i - 1, -1):
            poly[w] += poly[w - i]
    return poly
