"""Regressions in time: a slow window (a stall, a slow quarter of the gate) and a slowdown that
creeps in (judge v3, issue 28).

References:
    statistics.md, "Regressions that are not a steady shift" (scan statistics over time blocks,
    a trend test of the paired log ratio against time).
    J. Glaz, J. Naus and S. Wallenstein, "Scan statistics", Springer, 2001 (a maximum over
    windows of several widths, its multiplicity paid by a union bound).

Why: when k of m blocks are slow, a test on the mean of all blocks is bounded by
sqrt(k (m - 1) / (m - k)) however slow they are (judge v2 could not hold a quarter of the gate
at x3). Two checks look at the blocks in their order instead, on the same block statistics as
the p50 check (the trimmed mean of each block's paired log ratios):

    window: for every run of w consecutive blocks (w in 1, 2, 4, 8, ... up to half the blocks
        seen), the run's mean against log(1 + window tolerance), its spread estimated from the
        blocks *outside* the run (so the slow run does not inflate its own yardstick) with
        their long-run sd around their own trend (paired.long_run: a creep elsewhere does not
        widen it either); each run is a t test on the outside blocks'
        degrees of freedom at alpha / (number of runs): the union bound over runs and looks
        keeps the false-hold rate at most alpha. It fails when some run is slower than the
        window tolerance with confidence, and passes when every run's upper bound is below it.
    creep: a least-squares line through the blocks against their order; its value at the
        last block seen (the candidate's ratio now, not on average) against log(1 + creep
        tolerance), with the residuals' long-run sd (so the trend, which is the regression, is
        not read as noise) and the standard error of a fitted value at the end of the line; it
        fails only when the line also rose with confidence (a steady shift is the level
        checks', not a creep); a second line through the later half of the blocks catches a
        creep that sets in mid-way, each line at half the check's levels.

Both are one-sided and spend their alpha over the plan's looks like every latency check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gate.analysis.paired import MIN_TEST_BLOCKS, long_run, t_quantile

__all__ = ["Creep", "Window", "creep_test", "window_test", "window_widths"]


def window_widths(m: int) -> tuple[int, ...]:
    """Run widths tested over m blocks: 1, 2, 4, ... up to half of them."""
    out = []
    w = 1
    while w <= m // 2:
        out.append(w)
        w *= 2
    return tuple(out)


@dataclass(frozen=True)
class Window:
    """The worst run of blocks at one look: its first block, width, mean (log ratio), and the
    bounds of the run that decides each side (lower: the most significant run; upper: the
    largest upper bound over runs)."""

    blocks: int
    runs: int
    start: int
    width: int
    mean: float
    lower: float
    upper: float
    worst_upper_start: int
    worst_upper_width: int
    run_upper: float = math.inf  # the upper bound of the run that decides the lower side


def window_test(x: np.ndarray, alpha: float, beta: float) -> Window:
    """The scan over runs of blocks (module docstring); x in block order, no NaN."""
    x = np.asarray(x, np.float64)
    m = int(x.size)
    widths = window_widths(m)
    if m < MIN_TEST_BLOCKS + 2 or not widths:
        return Window(m, 0, 0, 0, math.nan, -math.inf, math.inf, 0, 0)
    runs = sum(m - w + 1 for w in widths)
    a, b = alpha / runs, beta / runs
    csum = np.concatenate([[0.0], np.cumsum(x)])
    best = (-math.inf, 0, 0, math.nan, math.inf)
    worst = (-math.inf, 0, 0)
    for w in widths:
        for s in range(m - w + 1):
            outside = np.concatenate([x[:s], x[s + w :]])
            lr = long_run(outside, detrend=True)
            if lr.df < 2 or not math.isfinite(lr.sd):
                continue
            mean = float(csum[s + w] - csum[s]) / w
            # The run's mean has the long-run sd of w blocks; the outside blocks say how much.
            se = lr.sd / math.sqrt(w)
            lo = mean - t_quantile(a, lr.df) * se
            hi = mean + t_quantile(b, lr.df) * se
            if lo > best[0]:
                best = (lo, s, w, mean, hi)
            if hi > worst[0]:
                worst = (hi, s, w)
    return Window(
        m, runs, best[1], best[2], best[3], best[0], worst[0], worst[1], worst[2], best[4]
    )


@dataclass(frozen=True)
class Creep:
    """The fitted log ratio at the last block seen, its bounds, and the fitted start."""

    blocks: int
    start: float
    end: float
    lower: float
    upper: float
    slope: float
    rise_lower: float = -math.inf  # the rise over the line (end - start), its lower bound


def _line(x: np.ndarray, alpha: float, beta: float) -> Creep:
    """The fitted end of a least-squares line through x and its bounds, from the residuals'
    long-run variance (paired.long_run)."""
    m = int(x.size)
    k = np.arange(m, dtype=np.float64)
    kc = k - k.mean()
    # Standard error of the fitted value at the last block: sd sqrt(1/m + (k_end - mean)^2 / Sxx).
    lever = math.sqrt(1.0 / m + float(kc[-1] ** 2) / float(kc @ kc))
    lr = long_run(x, detrend=True)
    end = lr.intercept + lr.slope * (m - 1)
    se = lr.sd * lever
    t = t_quantile(alpha, lr.df)
    lo = end - t * se
    hi = end + t_quantile(beta, lr.df) * se
    rise_lo = (lr.slope - t * lr.sd / math.sqrt(float(kc @ kc))) * (m - 1)
    return Creep(m, lr.intercept, end, lo, hi, lr.slope, rise_lo)


def creep_test(x: np.ndarray, alpha: float, beta: float) -> Creep:
    """Lines through the block statistics (module docstring): one through every block seen and
    one through the later half (a creep that sets in mid-way bends the first line), each at
    half the levels; the worse one decides. x in block order, no NaN."""
    x = np.asarray(x, np.float64)
    m = int(x.size)
    if m < MIN_TEST_BLOCKS + 2:
        return Creep(m, math.nan, math.nan, -math.inf, math.inf, math.nan)
    half = m - m // 2
    if m // 2 < MIN_TEST_BLOCKS + 2:
        return _line(x, alpha, beta)
    fits = [_line(x, alpha / 2.0, beta / 2.0), _line(x[half - 1 :], alpha / 2.0, beta / 2.0)]
    worst = max(fits, key=lambda f: min(f.lower, f.lower + f.rise_lower))
    return Creep(
        m,
        worst.start,
        worst.end,
        worst.lower,
        max(f.upper for f in fits),
        worst.slope,
        worst.rise_lower,
    )
