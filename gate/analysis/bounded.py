"""Anytime-valid confidence sequence for the mean of paired differences in [-1, 1], by betting.

References:
    I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random variables by betting",
    Journal of the Royal Statistical Society B 86(1), 2024.
    G. Shafer and V. Vovk, "Game-Theoretic Foundations for Probability and Finance", 2019.
    J. Ville, "Etude critique de la notion de collectif", 1939.

Why betting: goodput and collapse are fractions of mirrored requests, so each request gives a
pair of indicators and their difference d_i in {-1, 0, 1}. A test that "the mean difference is at
most m" should be valid at every look and adapt to the (unknown, often tiny) variance: the
capital process K_t(m) = prod_i (1 + lam (d_i - m)) with a fixed 0 <= lam < 1/(1 + m) is a
nonnegative supermartingale whenever each d_i has conditional mean <= m, so by Ville's
inequality sup_t K_t(m) >= 1/alpha has probability <= alpha. The bets are lam = c / (1 + m)
for a fixed grid of c (0.9, then halvings from 1/2 down to 1/1024): each step's factor is
(1 - c) + c (1 + d_i) / (1 + m), positive, and falling as m grows, so the rejected m form an
interval. Averaging the capital of the grid is again a supermartingale and is within a constant
of the best bet in hindsight, so a near-certain difference (d always 0: bet big) and a small
noisy one are both found without tuning on the data. Rejecting "mean <= m" for every m below L
(and "mean >= m" for every m above U, mirrored) gives the sequence [L, U] at level 1 - 2 alpha;
the sup over time makes it the running intersection, so decisions made on it never flip back.
What it bounds, precisely: the supermartingale argument needs every step's conditional mean to
be <= m, so a rejection says the mean exceeded m for at least part of the run (under a load
that swings, perhaps only in its bursts), which is the claim a hold needs.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["paired_mean_cs"]

_BETS = np.array([0.9] + [2.0**-k for k in range(1, 11)])


def _max_log_capital(d: np.ndarray, m: float) -> float:
    """log sup_t of the averaged capital for H0: mean <= m (bets on d above m)."""
    if d.size == 0:
        return 0.0
    steps = np.log((1.0 - _BETS)[:, None] + np.outer(_BETS, (1.0 + d) / (1.0 + m)))
    paths = np.cumsum(steps, axis=1)
    top = paths.max(axis=0)
    mix = top + np.log(np.mean(np.exp(paths - top), axis=0))
    return float(max(mix.max(), 0.0))


def _bound(d: np.ndarray, alpha: float, upper: bool) -> float:
    """Largest m rejected for H0: mean <= m (the lower bound), or mirrored for the upper.

    The capital falls as m grows, so the rejected m form an interval [-1, L) and bisection
    finds L; the bisection keeps the rejected end, so rounding never widens a claim.
    """
    x = -d if upper else d
    thr = math.log(1.0 / alpha)
    lo, hi = -1.0 + 1e-9, 1.0 - 1e-9
    if _max_log_capital(x, lo) < thr:
        return 1.0 if upper else -1.0
    if _max_log_capital(x, hi) >= thr:
        return -hi if upper else hi
    while hi - lo > 1e-5:
        mid = 0.5 * (lo + hi)
        if _max_log_capital(x, mid) >= thr:
            lo = mid
        else:
            hi = mid
    return -lo if upper else lo


def paired_mean_cs(d: np.ndarray, alpha: float) -> tuple[float, float]:
    """Anytime-valid [lower, upper] for the mean of d (values in [-1, 1], in time order).

    Each side at alpha: a decision "mean > m" made on the lower end is wrong with probability
    at most alpha at any stopping time, and so is "mean < m" on the upper end.
    """
    arr = np.asarray(d, dtype=np.float64).ravel()
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if arr.size and (arr.min() < -1.0 or arr.max() > 1.0):
        raise ValueError("differences must lie in [-1, 1]")
    return _bound(arr, alpha, upper=False), _bound(arr, alpha, upper=True)
