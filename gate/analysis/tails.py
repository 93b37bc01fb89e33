"""The tail check: do more of the candidate's requests land in the slow tail than the
reference's, once the candidate is allowed its tolerance? (judge v3, issue 28)

References:
    statistics.md, "Regressions that are not a steady shift" (exceedance counts over a high
    quantile of the reference, paired and blocked).
    E. L. Lehmann and J. P. Romano, "Testing statistical hypotheses", 3rd ed., 2005, 15.2
    (a test statistic that is a symmetric function of exchangeable pairs has mean zero).

Why exceedances: a p99 that grows on a few percent of requests moves neither a median nor a
block mean (judge v2's tail mean per block of 40 held 15% of a tail x1.30 at 1,000 requests).
What such a regression does move is how many of the candidate's requests are slower than the
reference's slow ones. For a tolerance `tol` the candidate's latencies are first deflated by
theta = 1 + tol; the pooled sample {reference} U {candidate / theta} gives thresholds h_u at
its upper quantiles 1 - u for the levels in `LEVELS` (10%, 5%, 2%, 1%: a slow tenth down to the
slowest percent); and each block's statistic is

    D_uk(theta) = mean_k 1{c_i / theta > h_u} - mean_k 1{r_i > h_u},

one series per level u. When the candidate is exactly theta times the reference in
distribution and a pair's two engines are exchangeable once it is deflated, every D_u has mean
zero (the thresholds are a symmetric function of the pooled pairs); a candidate within
tolerance has a lighter deflated tail and every D_u below zero. So the tail check tests each
level's series with the block test of paired.py on D_u(1 + tol), each at a quarter of the
check's alpha (a union bound over the four levels): it fails when some level's lower bound is
above zero, and passes when every level's upper bound is below. One test per level, not a
sum: a regression of the slowest few percent raises the 1-2% levels while deflating the body
lowers the 10% level, and a sum would let the second cancel the first. Levels down to 1% see
"3% of requests 4x slower" and "the slowest 1% 1.75x"; a steady shift moves every level.

The ratio reported is the tail scale: the largest theta at which some level's mean D_u is still
zero (the factor by which the candidate's tail must be deflated to weigh nowhere more than the
reference's), with the interval from inverting the same tests over theta (bisection on log
theta; every D_u falls as theta grows). The block series' spread is the classical long-run one
(paired.long_run): the series are differences of counts, mostly small integers over a block's
size, where a robust scale (Qn) reads the many ties as no spread at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gate.analysis.paired import BlockTest, level_test

__all__ = ["LEVELS", "LevelTests", "TailScale", "exceedance_blocks"]

LEVELS: tuple[float, ...] = (0.10, 0.05, 0.02, 0.01, 0.005)
_LOG_RANGE = (math.log(0.05), math.log(50.0))


def exceedance_blocks(
    ref: np.ndarray, cand: np.ndarray, block: np.ndarray, m: int, theta: float
) -> np.ndarray:
    """D_uk(theta), shape (levels, m) (module docstring); pairs with block >= m are ignored;
    NaN for an empty block."""
    keep = block < m
    r, c, b = ref[keep], cand[keep] / theta, block[keep]
    out = np.full((len(LEVELS), m), np.nan)
    if r.size == 0:
        return out
    pooled = np.concatenate([r, c])
    h = np.quantile(pooled, [1.0 - u for u in LEVELS])
    diff = (c[:, None] > h[None, :]).astype(np.float64) - (r[:, None] > h[None, :])
    counts = np.bincount(b, minlength=m).astype(np.float64)
    ok = counts > 0
    for j in range(len(LEVELS)):
        sums = np.bincount(b, weights=diff[:, j], minlength=m)
        out[j, ok] = sums[ok] / counts[ok]
    return out


@dataclass(frozen=True)
class LevelTests:
    """The per-level tests at one theta: the worst lower bound and the worst upper bound."""

    blocks: int
    mean: float  # the largest level mean
    lower: float  # the largest lower bound (fail when > 0)
    upper: float  # the largest upper bound (pass when < 0)
    phi: float
    level: float  # the level with the largest lower bound


class TailScale:
    """The exceedance tests of one metric at one look, evaluable at any theta."""

    def __init__(
        self,
        ref: np.ndarray,
        cand: np.ndarray,
        block: np.ndarray,
        m: int,
        alpha: float,
        beta: float,
    ) -> None:
        self.ref, self.cand, self.block, self.m = ref, cand, block, m
        self.alpha, self.beta = alpha / len(LEVELS), beta / len(LEVELS)
        self._cache: dict[float, LevelTests] = {}

    def test(self, theta: float) -> LevelTests:
        got = self._cache.get(theta)
        if got is None:
            x = exceedance_blocks(self.ref, self.cand, self.block, self.m, theta)
            tests: list[BlockTest] = []
            for row in x:
                tests.append(level_test(row[~np.isnan(row)], self.alpha, self.beta, detrend=False))
            worst = max(range(len(tests)), key=lambda j: tests[j].lower)
            got = LevelTests(
                blocks=min(t.blocks for t in tests),
                mean=max(t.mean for t in tests),
                lower=tests[worst].lower,
                upper=max(t.upper for t in tests),
                phi=max(t.phi for t in tests),
                level=LEVELS[worst],
            )
            self._cache[theta] = got
        return got

    def _solve(self, value: str) -> float:
        """The theta where the chosen statistic crosses zero (each falls as theta grows)."""
        lo, hi = _LOG_RANGE

        def f(log_theta: float) -> float:
            return float(getattr(self.test(math.exp(log_theta)), value))

        if f(lo) <= 0.0:
            return 0.0
        if f(hi) > 0.0:
            return math.inf
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if f(mid) > 0.0:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-4:
                break
        return math.exp(0.5 * (lo + hi))

    def interval(self) -> tuple[float, float, float]:
        """(estimate, lower, upper) of the tail scale theta."""
        return self._solve("mean"), self._solve("lower"), self._solve("upper")
