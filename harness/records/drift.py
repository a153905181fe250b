"""Did the machine drift? Measurements late in a study against early ones.

A configuration measured several times should give the same figure early and late; when
the machine itself changes (thermal limits, a neighbour's load, a clock that ramps
down), the late measurements move beyond the early ones' spread. Each configuration
measured twice or more is taken against its own median (so configurations of different
speeds pool), the study's measurements are split at their middle in time, and the late
half is compared with the early half by the method of training_harness.records.speedup: drift is
named when the interval of late over early lies beyond the noise threshold.

Drift touches every comparison between figures taken at different times: those of a
configuration measured only early or only late against the rest most; the pairs of the
interleaved rounds least (both members of a pair share the moment).

`machine_speed` says how fast the machine ran at each moment, from the configurations
measured more than once (the references): each of their measurements over its own
level, the median of its paired measurements (the interleaved rounds', taken together
and so on one footing) where it has some, else of all. A figure measured once is
divided by the speed interpolated between the nearest references' samples in time, which
puts it on the rounds' footing; the error of that, each sample left out and predicted
from the others, is the uncertainty of a figure so normalised.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from training_harness.records.pooled import Pooled
from training_harness.records.speedup import SAME, Ratio, ratio

MIN_EACH_HALF = 4  # fewer than 4 + 4 measurements: no interval reaches 95%


@dataclass
class Drift:
    late_over_early: Ratio
    early_only: list[str] = field(default_factory=list)  # a trial id per configuration
    late_only: list[str] = field(default_factory=list)

    @property
    def named(self) -> bool:
        return self.late_over_early.verdict != SAME

    def text(self) -> str:
        r = self.late_over_early
        way = "faster" if r.estimate > 1 else "slower"
        out = (f"the machine drifted: measurements in the second half of the study ran "
               f"{r.estimate:.2f}x the first half's ({r.interval}; each configuration against "
               f"its own median), {way} late")
        touched = [f"measured only early: trial(s) {', '.join(self.early_only)}"] * bool(
            self.early_only) + [f"measured only late: trial(s) {', '.join(self.late_only)}"
                                ] * bool(self.late_only)
        out += ("; it touches the figures compared across that time"
                + (f" ({'; '.join(touched)})" if touched else "")
                + ", less the interleaved rounds' pairs")
        return out


def drift(pools: dict[str, Pooled]) -> Drift | None:
    """Late over early across the study (None: too few repeated measurements to tell)."""
    moments = sorted(m.at for p in pools.values() for m in p.measurements)
    if not moments:
        return None
    middle = moments[(len(moments) - 1) // 2]  # the early half ends here
    early, late = [], []
    early_only, late_only = [], []
    for p in pools.values():
        if p.n < 2:  # a figure of one measurement has no early and late of its own
            continue
        first = p.measurements[0].trial_id
        if all(m.at <= middle for m in p.measurements):
            early_only.append(first)
        elif all(m.at > middle for m in p.measurements):
            late_only.append(first)
        for m in p.measurements:
            (early if m.at <= middle else late).append(m.value / p.median)
    if min(len(early), len(late)) < MIN_EACH_HALF:
        return None
    return Drift(ratio(late, early), early_only, late_only)


@dataclass
class MachineSpeed:
    """The machine's speed at each moment of a study, relative to the references' levels."""
    samples: list[tuple[int, float]] = field(default_factory=list)  # (moment, speed), by time

    def at(self, moment: int) -> float:
        """The speed at `moment`: the nearest samples before and after, interpolated
        linearly (the nearest one alone past either end; 1 where there is none)."""
        return _interpolated(self.samples, moment)

    def uncertainty(self, quantile: float = 0.9) -> float:
        """A normalised single figure's error, as a log: the `quantile` of each sample's
        error when predicted from the others (0 with fewer than two samples)."""
        s = self.samples
        if len(s) < 2:
            return 0.0
        errors = sorted(abs(math.log(v / _interpolated(s[:i] + s[i + 1:], at)))
                        for i, (at, v) in enumerate(s))
        return errors[math.ceil(quantile * len(errors)) - 1]


def machine_speed(pools: dict[str, Pooled]) -> MachineSpeed:
    """The speed samples of every configuration measured twice or more."""
    samples = []
    for p in pools.values():
        if p.n < 2:
            continue
        paired = [m.value for m in p.measurements if m.pair is not None]
        level = statistics.median(paired or p.values)
        samples += [(m.at, m.value / level) for m in p.measurements]
    return MachineSpeed(sorted(samples))


def _interpolated(samples: list[tuple[int, float]], moment: int) -> float:
    if not samples:
        return 1.0
    before = [s for s in samples if s[0] <= moment] or samples[:1]
    after = [s for s in samples if s[0] >= moment] or samples[-1:]
    (a, va), (b, vb) = before[-1], after[0]
    return va if a == b else va + (vb - va) * (moment - a) / (b - a)
