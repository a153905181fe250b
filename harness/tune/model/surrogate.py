"""What the search believes of a configuration it has not measured: a mean and an
uncertainty (docs/tuning.md, "How it searches"), from a Gaussian process over the
configuration's features whose kernel is a Bayesian linear model's plus a local term for
what no single feature explains (ZeRO-3 slow only at small micro-batches):

    log(measured / prior) = w0 + w . x + g(x) + noise,   w ~ N(0, PRIOR_SD^2),
                            g ~ GP(0, INTERACTION_SD^2 exp(-|x - x'|^2 / LENGTH))

Its noise is the fit's leave-one-out error: a study whose measurements the model keeps
missing stays uncertain everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# A feature's weight before it is measured: 2x at one sd (log units), the size of the
# estimator's errors on the one H100 run (61% median step-time error).
PRIOR_SD = 0.7
INTERCEPT_SD = 1.5  # the common ratio may be far off (a CPU's MFU against the assumed one)
INTERACTION_SD = 0.4  # what no single feature explains: a combination's own departure ...
LENGTH = 4.0  # ... shared with configurations nearby: 0.61 at one choice away, 0.37 at two
NOISE_FLOOR = 0.03  # repeats of one configuration differ by a few percent at least
NOISE_PRIOR = 0.15  # until a few trials show the model's own errors


class Surrogate:
    """Fitted to `y` = log(measured / prior) of `rows` of features; `predict` gives (mean,
    sd) in log units."""

    def __init__(self, rows: Sequence[dict[str, float]], y: Sequence[float]):
        self.n, self.rows = len(rows), list(rows)
        self.y = np.asarray(y, dtype=float)
        self.noise = self._noise()

    def _features(self, rows: Sequence[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        names = sorted({k for row in self.rows for k in row} | {k for row in rows for k in row})
        index = {name: i + 1 for i, name in enumerate(names)}

        def matrix(of: Sequence[dict[str, float]]) -> np.ndarray:
            x = np.zeros((len(of), len(names) + 1))
            x[:, 0] = 1.0
            for r, row in enumerate(of):
                for name, value in row.items():
                    x[r, index[name]] = value
            return x
        return matrix(self.rows), matrix(rows)

    @staticmethod
    def _kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        scale = np.r_[INTERCEPT_SD**2, np.full(a.shape[1] - 1, PRIOR_SD**2)]  # intercept first
        linear = (a * scale) @ b.T  # the linear model's covariance
        d2 = (a[:, 1:] ** 2).sum(1)[:, None] + (b[:, 1:] ** 2).sum(1)[None, :] \
            - 2 * a[:, 1:] @ b[:, 1:].T
        return linear + INTERACTION_SD**2 * np.exp(-np.maximum(d2, 0.0) / LENGTH)

    def _noise(self) -> float:
        """The study's own error: the root mean square of the leave-one-out residuals
        (closed form: [K^-1 y]_i / [K^-1]_ii), shrunk towards NOISE_PRIOR while few."""
        if self.n < 3:
            return NOISE_PRIOR
        x, _ = self._features([])
        inv = np.linalg.inv(self._kernel(x, x) + NOISE_PRIOR**2 * np.eye(self.n))
        resid = (inv @ self.y) / np.diag(inv)
        measured = float(np.sqrt(np.mean(resid**2)))
        weight = self.n / (self.n + 5.0)  # five trials' worth of the prior's say
        return max(NOISE_FLOOR, weight * measured + (1 - weight) * NOISE_PRIOR)

    def predict(self, rows: Sequence[dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of log(measured / prior) for each row, the noise included."""
        x, z = self._features(rows)
        scale = np.r_[INTERCEPT_SD**2, np.full(z.shape[1] - 1, PRIOR_SD**2)]
        own = np.einsum("ij,ij->i", z * scale, z) + INTERACTION_SD**2  # k(z, z)
        if not self.n:
            return np.zeros(len(z)), np.sqrt(own + self.noise**2)
        chol = np.linalg.cholesky(self._kernel(x, x) + self.noise**2 * np.eye(self.n))
        cross = self._kernel(z, x)  # m x n
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, self.y))
        v = np.linalg.solve(chol, cross.T)
        var = np.maximum(own - (v * v).sum(0), 0.0)
        return cross @ alpha, np.sqrt(var + self.noise**2)


def prob_above(mean: np.ndarray, sd: np.ndarray, bar: float) -> np.ndarray:
    """P(value > bar) for normal beliefs (all in log units)."""
    z = (mean - bar) / sd
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """E[max(value - best, 0)] for normal beliefs: high for a configuration likely better,
    and for one the study knows little of (the search's exploration)."""
    z = (mean - best) / sd
    cdf = prob_above(mean, sd, best)
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return sd * (z * cdf + pdf)


_erf = np.vectorize(math.erf, otypes=[float])
