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

    D_k(theta) = sum_u [mean_k 1{c_i / theta > h_u} - mean_k 1{r_i > h_u}] / sqrt(u (1 - u)),

each level weighted to the same variance. When the candidate is exactly theta times the
reference in distribution and a pair's two engines are exchangeable once it is deflated, D has
mean zero (the thresholds are a symmetric function of the pooled pairs); a candidate within
tolerance has a lighter deflated tail and D below zero. So the tail check is the block test of
paired.py on D(1 + tol): fail when its lower bound is above zero, pass when its upper bound is
below. Levels down to 1% see "3% of requests 4x slower" (the slowest 1-2% of the candidate all
come from the slowed share) and "the slowest 1% 1.75x" (at the 2% and 1% levels the candidate
has up to twice the reference's exceedances); a steady shift moves every level.

The ratio reported is the tail scale: the theta at which the mean of D is zero (the factor by
which the candidate's tail must be deflated to weigh as the reference's), with the interval
from inverting the same test over theta (bisection on log theta; D falls as theta grows).
"""

from __future__ import annotations

import math

import numpy as np

from gate.analysis.paired import BlockTest, level_test

__all__ = ["LEVELS", "TailScale", "exceedance_blocks", "tail_scale"]

LEVELS: tuple[float, ...] = (0.10, 0.05, 0.02, 0.01)
_WEIGHTS = np.array([1.0 / math.sqrt(u * (1.0 - u)) for u in LEVELS])
_LOG_RANGE = (math.log(0.05), math.log(50.0))


def exceedance_blocks(
    ref: np.ndarray, cand: np.ndarray, block: np.ndarray, m: int, theta: float
) -> np.ndarray:
    """D_k(theta) for blocks 0..m-1 (module docstring); pairs with block >= m are ignored."""
    keep = block < m
    r, c, b = ref[keep], cand[keep] / theta, block[keep]
    if r.size == 0:
        return np.zeros(0)
    pooled = np.concatenate([r, c])
    h = np.quantile(pooled, [1.0 - u for u in LEVELS])
    diff = (c[:, None] > h[None, :]).astype(np.float64) - (r[:, None] > h[None, :])
    per = diff @ _WEIGHTS
    counts = np.bincount(b, minlength=m).astype(np.float64)
    sums = np.bincount(b, weights=per, minlength=m)
    out = np.full(m, np.nan)
    ok = counts > 0
    out[ok] = sums[ok] / counts[ok]
    return out


class TailScale:
    """The exceedance test of one metric at one look, evaluable at any theta."""

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
        self.alpha, self.beta = alpha, beta
        self._cache: dict[float, BlockTest] = {}

    def test(self, theta: float) -> BlockTest:
        got = self._cache.get(theta)
        if got is None:
            x = exceedance_blocks(self.ref, self.cand, self.block, self.m, theta)
            got = level_test(x[~np.isnan(x)], self.alpha, self.beta, detrend=False)
            self._cache[theta] = got
        return got

    def _solve(self, value: str) -> float:
        """The theta where the chosen statistic of D(theta) crosses zero (D falls in theta)."""
        lo, hi = _LOG_RANGE

        def f(log_theta: float) -> float:
            bt = self.test(math.exp(log_theta))
            return float(getattr(bt, value))

        if f(lo) <= 0.0:
            return 0.0 if value != "upper" else math.exp(lo)
        if f(hi) > 0.0:
            return math.inf
        for _ in range(30):
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


def tail_scale(
    ref: np.ndarray, cand: np.ndarray, block: np.ndarray, m: int, alpha: float, beta: float
) -> TailScale:
    return TailScale(ref, cand, block, m, alpha, beta)
