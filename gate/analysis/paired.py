"""Paired, blocked, anytime-valid comparison of two engines' latencies.

References:
    T. L. Lai, "On confidence sequences", Annals of Statistics 4(2), 1976.
    M. F. Perez-Ortiz, T. Lardy, R. de Heide and P. Grunwald, "E-statistics, group invariance
    and anytime valid testing", Annals of Statistics 52(4), 2024.
    E. Kunsch, "The jackknife and the bootstrap for general stationary observations", Annals
    of Statistics 17(3), 1989 (blocks of consecutive observations keep their dependence).
    C. J. Geyer, "Practical Markov chain Monte Carlo", Statistical Science 7(4), 1992
    (the initial positive sequence estimate of the correlation time).

Why: the two engines of a gate serve the same mirrored schedule, so request i of the candidate
and request i of the reference share their prompt, their output length and the load around
them. Their log ratio cancels all of that; what is left is each engine's own noise, and that
noise is not independent from request to request: requests that share a batch share its
latency, and batches follow one another in time. Tests that assume independent requests then
hold identical engines far more often than their alpha says (issue 17 measured 2.0% instead of
0.375% for batches of 32).

So the gate:
    1. joins the two engines' samples by schedule id (an error on one side drops that pair);
    2. cuts the joined pairs, in schedule order, into blocks of `block_length(planned)`
       consecutive pairs, a length fixed from the planned size before any sample is seen and
       at least 32 requests (four batches of 8, one of 32);
    3. reduces each block to one statistic: the log ratio of the candidate's to the
       reference's block quantile (p50, p90, ...) or block tail mean (the slowest share);
       under identical engines every block statistic is symmetric about 0 (the pair is
       exchangeable), under a regression by a factor k its centre is log k;
    4. tests the mean of the block statistics with the anytime-valid t test of Lai (1976):
       the Bayes factor of a normal prior on the standardized effect, mixed over the scale
       with the right-Haar prior, is an e-process for "the mean is theta, whatever the
       variance" (Perez-Ortiz et al. 2024), so {theta : BF(theta) < 1/alpha} is a confidence
       sequence valid at every number of blocks at once, and the gate may look as often as
       it likes. Its variance is inflated by twice the blocks' lag-1 and lag-2
       autocovariance when together positive, for what dependence is left between
       neighbouring blocks (a correlation much longer than a block, which the reported
       correlation time shows, is beyond what this corrects).

Every block statistic averages a few dozen requests, so it is close to normal even when single
latencies are heavy-tailed, and neighbouring blocks are close to independent once a block is
longer than the correlation time (measured here, by Geyer's estimate, and reported). The
calibration (calibration.py) checks both on engines whose requests share batches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

__all__ = [
    "BLOCKS_MAX",
    "BLOCK_MIN",
    "MIN_BLOCKS",
    "BlockTest",
    "block_for",
    "block_length",
    "block_stats",
    "block_test",
    "correlation_time",
    "detectable_shift",
    "join",
    "planned_shift",
    "spread_factor",
    "t_crit",
    "tune_g",
]

BLOCK_MIN = 32  # requests per block at least: four batches of 8, one batch of 32
BLOCKS_MAX = 256  # blocks per planned scenario at most: longer blocks beyond that
MIN_BLOCKS = 3  # a t statistic needs two degrees of freedom
TRIM = 0.2  # share trimmed at each end of a block's log ratios for the p50 statistic
TUNE_BLOCKS = 16  # the t test's prior is tuned to decide best at this many blocks (or fewer)
POWER_Z = float(stats.norm.ppf(0.8))  # "could detect": with 80% power


def block_length(planned: int) -> int:
    """Requests per block for a scenario of `planned` requests per engine: fixed in advance."""
    return max(BLOCK_MIN, math.ceil(max(int(planned), 1) / BLOCKS_MAX))


def block_for(planned: int, q: float | None, tail_start: float = 0.95) -> int:
    """Requests per block of one check: `block_length(planned)`, longer where a block must
    hold enough of the distribution's end: at least 3 requests beyond a quantile on the far
    side (p99: 300, p99.9: 3,000) and at least 2 in the tail share (the slowest 5%: 40)."""
    base = block_length(planned)
    if q is None:
        return max(base, math.ceil(2.0 / (1.0 - tail_start) - 1e-9))
    return max(base, math.ceil(3.0 / min(q, 1.0 - q) - 1e-9))


def join(
    ref: np.ndarray,
    ref_ids: np.ndarray | None,
    cand: np.ndarray,
    cand_ids: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reference, candidate, ids) of the requests both engines measured, in schedule order.

    Without ids (hand-built samples) the two arrays are paired by position, as if their ids
    were 0, 1, 2, ...
    """
    r_ids = np.arange(ref.size) if ref_ids is None else np.asarray(ref_ids, np.int64)
    c_ids = np.arange(cand.size) if cand_ids is None else np.asarray(cand_ids, np.int64)
    common, ri, ci = np.intersect1d(r_ids, c_ids, assume_unique=False, return_indices=True)
    return ref[ri], cand[ci], common


def _log(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.log(np.maximum(x, 1e-9)), np.float64)


def block_stats(
    ref: np.ndarray,
    cand: np.ndarray,
    block: int,
    q: float | None,
    tail_start: float = 0.95,
    tail_top: float = 0.995,
) -> np.ndarray:
    """One statistic per complete block of `block` consecutive pairs.

    q 0.5: the trimmed mean of the pairs' log ratios (each request against its own mirror);
    another q: log(candidate's block q-quantile / reference's). q None: the tail, log of the
    ratio of the means of each engine's slowest (1 - tail_start) share of the block (at least
    two requests), each value capped at its own block's `tail_top` quantile.
    """
    n = int(min(ref.size, cand.size)) // block
    if n == 0:
        return np.zeros(0)
    r = ref[: n * block].reshape(n, block)
    c = cand[: n * block].reshape(n, block)
    if q == 0.5:
        # The centre is paired request by request: the trimmed mean of the log ratios cancels
        # what the two engines share (prompt, output length, the load around the request),
        # and trimming a fifth at each end keeps one queueing spike from moving the block.
        return np.asarray(stats.trim_mean(_log(c) - _log(r), TRIM, axis=1), np.float64)
    if q is not None:
        diff: np.ndarray = _log(np.asarray(np.quantile(c, q, axis=1))) - _log(
            np.asarray(np.quantile(r, q, axis=1))
        )
        return diff
    m = max(2, math.ceil((1.0 - tail_start) * block))

    def tail_mean(x: np.ndarray) -> np.ndarray:
        cap = np.quantile(x, tail_top, axis=1, keepdims=True)
        top = np.sort(np.minimum(x, cap), axis=1)[:, -m:]
        return np.asarray(top.mean(axis=1), np.float64)

    tail: np.ndarray = _log(tail_mean(c)) - _log(tail_mean(r))
    return tail


def t_crit(n: int, alpha: float, g: float) -> float:
    """The |t| at which the right-Haar Bayes factor of n observations reaches 1/alpha.

    BF = (1 + n g)^(-1/2) [(1 + t^2/v) / (1 + t^2/(v (1 + n g)))]^(n/2), v = n - 1, for a
    N(0, g) prior on the standardized mean. Solved for t in closed form; inf when even an
    infinite t would not reach 1/alpha at this n.
    """
    if n < 2:
        return math.inf
    v = n - 1
    a = 1.0 + n * g
    k = (math.sqrt(a) / alpha) ** (2.0 / n)
    if k >= a:
        return math.inf
    u = (k - 1.0) / (1.0 - k / a)
    return math.sqrt(v * u)


@lru_cache(maxsize=4096)
def tune_g(blocks: int, alpha: float) -> float:
    """The prior scale for a scenario planned at `blocks` blocks: the one that makes the
    boundary tightest at min(blocks, 16). Tuned to the planned end, a long scenario's early
    looks could decide nothing (at 64 blocks planned the boundary is infinite below 12); tuned
    to 16 blocks it is finite from 7 on and, at 256 blocks, 5% wider than the tightest: a
    large regression stops a long gate within its first looks."""
    blocks = max(min(blocks, TUNE_BLOCKS), MIN_BLOCKS)
    grid = np.geomspace(1e-3, 1e3, 121)
    values = [t_crit(blocks, alpha, float(g)) for g in grid]
    return float(grid[int(np.argmin(values))])


@dataclass(frozen=True)
class BlockTest:
    """The confidence sequence for the mean block statistic at the current number of blocks.

    mean, lower, upper: log scale; sd: the blocks' standard deviation, inflated by their lag-1
    and lag-2 autocovariance when together positive; t: the critical |t| at this number of
    blocks.
    """

    blocks: int
    mean: float
    sd: float
    lower: float
    upper: float
    t: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.lower) and math.isfinite(self.upper)


def block_test(x: np.ndarray, alpha: float, g: float) -> BlockTest:
    """The anytime-valid interval for the mean of the block statistics x (module docstring)."""
    n = int(x.size)
    if n < MIN_BLOCKS:
        mean = float(x.mean()) if n else math.nan
        return BlockTest(n, mean, math.nan, -math.inf, math.inf, math.inf)
    mean = float(x.mean())
    dev = x - mean
    var = float(dev @ dev) / (n - 1)
    # Neighbouring blocks may still share a slow period: count the first two lags'
    # autocovariance when together positive (a long-run variance, truncated at lag 2).
    lags = sum(float(dev[k:] @ dev[:-k]) / (n - 1) for k in (1, 2) if n > k)
    sd = math.sqrt(max(var + 2.0 * max(lags, 0.0), 1e-24))
    t = t_crit(n, alpha, g)
    half = t * sd / math.sqrt(n)
    return BlockTest(n, mean, sd, mean - half, mean + half, t)


def detectable_shift(blocks: int, sd: float, alpha: float, g: float) -> float:
    """The log shift beyond the threshold a test of `blocks` blocks of this sd finds with 80%
    power: the boundary plus 0.84 standard errors."""
    if blocks < MIN_BLOCKS or not math.isfinite(sd):
        return math.inf
    t = t_crit(blocks, alpha, g)
    return (t + POWER_Z) * sd / math.sqrt(blocks)


def spread_factor(q: float | None) -> float:
    """Standard deviation of a block statistic per unit of per-request log-ratio noise and
    per sqrt(block): sqrt(q (1 - q)) / phi(z_q) for a quantile of normal noise; a tail mean
    of the slowest 5% is about as spread as the p97.5 quantile."""
    p = 0.975 if q is None else q
    z = float(stats.norm.ppf(p))
    return math.sqrt(p * (1.0 - p)) / float(stats.norm.pdf(z))


def planned_shift(
    planned: int, q: float | None, noise: float, alpha: float, tail_start: float = 0.95
) -> float:
    """The log shift beyond the threshold a check planned at `planned` requests per engine can
    detect with 80% power, when each pair's log ratio has sd `noise` (a planning assumption)."""
    block = block_for(planned, q, tail_start)
    blocks = planned // block
    sd = noise * spread_factor(q) / math.sqrt(block)
    return detectable_shift(blocks, sd, alpha, tune_g(blocks, alpha))


def size_to_detect(
    shift: float,
    q: float | None,
    noise: float,
    alpha: float,
    tolerance: float,
    tail_start: float = 0.95,
) -> int | None:
    """The smallest planned requests per engine whose check detects a regression of `shift`
    (relative, e.g. 0.05) with 80% power; None when beyond ten million."""
    target = math.log1p(shift) - math.log1p(tolerance)
    if target <= 0.0:
        return None

    def shift_at(n: int) -> float:
        return planned_shift(n, q, noise, alpha, tail_start)

    lo = hi = block_for(1, q, tail_start) * MIN_BLOCKS
    while shift_at(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 10_000_000:
            return None
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if shift_at(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def correlation_time(x: Sequence[float] | np.ndarray, max_lag: int = 1000) -> float:
    """Integrated correlation time of a series, in steps (1 for independent values).

    Geyer's initial positive sequence: 1 + 2 sum of autocorrelations, summed over pairs of
    lags while each pair's sum stays positive. NaN for fewer than 8 values.
    """
    a = np.asarray(x, np.float64)
    n = int(a.size)
    if n < 8:
        return math.nan
    d = a - a.mean()
    denom = float(d @ d)
    if denom <= 1e-12 * max(float(a @ a), 1e-300):
        return 1.0  # constant up to rounding: nothing to correlate
    lags = min(max_lag, n - 1)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(d, size)
    acov = np.fft.irfft(f * np.conj(f), size)[: lags + 1]
    rho = acov / denom
    tau = -1.0
    for k in range(0, lags - 1, 2):
        pair = rho[k] + rho[k + 1]
        if pair <= 0.0:
            break
        tau += 2.0 * pair
    return max(tau, 1.0)
