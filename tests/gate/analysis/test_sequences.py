"""Quantile confidence sequences: exactness against brute force, coverage, widths.

Measured with this implementation (alpha 0.05, mixture tuned at t): the p99 count interval as a
fraction of the distribution is -0.0110/+0.0080 at t = 1k (both ends finite) and
-0.0032/+0.0029 at t = 10k, against -0.014/+0.010 (upper end not finite) and -0.0032/+0.0028
in the reference table of statistics.md. min_samples_for_finite(0.99, alpha) is 417 at 0.05,
592 at 0.01 and 781 at 0.02/12 (the per-arm alpha of one of six default latency checks).
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import binom, norm

from gate.analysis.sequences import (
    concentration,
    count_bounds,
    log_mixture,
    min_samples_for_finite,
    quantile_cs,
)


def _log_m_lgamma(k: int, t: int, p: float, c: float) -> float:
    """log M_t(k) written out with math.lgamma, independent of the module's betaln path."""
    a, b = p * c, (1.0 - p) * c

    def lbeta(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    return lbeta(a + k, b + t - k) - lbeta(a, b) - k * math.log(p) - (t - k) * math.log1p(-p)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("alpha", [0.2, 0.05, 0.01])
@pytest.mark.parametrize("t_opt", [10, 200])
def test_count_bounds_match_brute_force(p: float, alpha: float, t_opt: int) -> None:
    c = concentration(p, alpha, t_opt)
    thr = math.log(1.0 / alpha)
    for t in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]:
        logs = [_log_m_lgamma(k, t, p, c) for k in range(t + 1)]
        if any(abs(v - thr) < 1e-9 for v in logs):
            continue  # a tie with the threshold: float noise decides, nothing to check
        inside = [k for k, v in enumerate(logs) if v < thr]
        assert inside == list(range(inside[0], inside[-1] + 1)), "the set must be an interval"
        assert count_bounds(t, p, alpha, t_opt) == (inside[0], inside[-1])


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("c", [0.5, 7.0, 300.0])
def test_mixture_is_a_mean_one_martingale(p: float, c: float) -> None:
    """E[M_t] = 1 under the null and E[M_{t+1} | k] = M_t(k): what Ville's inequality needs."""
    for t in [1, 5, 40, 400]:
        k = np.arange(t + 1)
        log_m = np.asarray(log_mixture(k, t, p, c))
        assert logsumexp(binom.logpmf(k, t, p) + log_m) == pytest.approx(0.0, abs=1e-9)
        nxt = np.asarray(log_mixture(np.arange(t + 2), t + 1, p, c))
        step = np.logaddexp(math.log(p) + nxt[1:], math.log1p(-p) + nxt[:-1])
        np.testing.assert_allclose(step, log_m, rtol=1e-9, atol=1e-9)


def test_quantile_cs_reads_order_statistics() -> None:
    t = 500
    x = np.arange(1.0, t + 1.0)
    k_lo, k_hi = count_bounds(t, 0.5, 0.05)
    assert quantile_cs(x, 0.5, 0.05) == (float(k_lo), float(k_hi + 1))
    assert quantile_cs(np.zeros(0), 0.5, 0.05) == (-math.inf, math.inf)
    lo, hi = quantile_cs(np.sort(np.random.default_rng(0).random(100)), 0.99, 0.05)
    assert hi == math.inf
    assert math.isfinite(lo)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    sigma=st.floats(0.05, 2.0),
    p=st.sampled_from([0.5, 0.9, 0.99]),
    alpha=st.sampled_from([0.05, 0.1]),
    seed=st.integers(0, 2**32 - 1),
)
def test_coverage_at_every_prefix(sigma: float, p: float, alpha: float, seed: int) -> None:
    """The CS holds the true quantile at all prefixes at once in >= 1 - alpha of the runs."""
    runs, n, t_opt = 200, 3000, 1000
    grid = np.unique(np.geomspace(5, n, 30).astype(int))
    truth = math.exp(sigma * norm.ppf(p))
    rng = np.random.default_rng(seed)
    misses = 0
    for _ in range(runs):
        x = rng.lognormal(0.0, sigma, n)
        for t in grid:
            lo, hi = quantile_cs(np.sort(x[:t]), p, alpha, t_opt=t_opt)
            if not lo <= truth < hi:
                misses += 1
                break
    # Ville's bound is conservative, so the rate is usually far below alpha; the slack only
    # guards against a 1-in-1000 unlucky draw of the seeds.
    assert misses <= binom.ppf(0.999, runs, alpha)


def test_coverage_rate_is_below_alpha_in_aggregate() -> None:
    """Pooled over many runs the miss rate sits below alpha (here much below)."""
    runs, n, p, alpha = 400, 2000, 0.9, 0.1
    grid = np.unique(np.geomspace(5, n, 25).astype(int))
    bounds = [count_bounds(int(t), p, alpha, t_opt=500) for t in grid]
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(runs):
        # Count of samples at or below the true quantile, at every prefix: Binomial(t, p).
        below = np.cumsum(rng.random(n) < p)
        if any(not lo <= below[t - 1] <= hi for t, (lo, hi) in zip(grid, bounds, strict=True)):
            misses += 1
    assert misses / runs <= alpha


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("t_opt", [None, 1000])
def test_widths_shrink_with_t(p: float, t_opt: int | None) -> None:
    ts = [100, 200, 500, 1000, 2000, 5000, 10_000, 50_000]
    widths = []
    for t in ts:
        k_lo, k_hi = count_bounds(t, p, 0.05, t_opt)
        widths.append((k_hi - k_lo) / t)
    assert all(b < a for a, b in itertools.pairwise(widths)), widths


def test_p99_widths_near_reference_table() -> None:
    """statistics.md: -0.014/+0.010 at 1k (upper not finite), -0.0032/+0.0028 at 10k.

    Ours, alpha 0.05 tuned at t: -0.0110/+0.0080 at 1k (finite) and -0.0032/+0.0029 at 10k.
    The 1k upper end differs in kind (finite here) because the table's mixture was tuned for a
    larger planned size; tuned at 10k, ours is not finite at 1k either.
    """
    p = 0.99
    lo1, hi1 = count_bounds(1000, p, 0.05)
    lo10, hi10 = count_bounds(10_000, p, 0.05)
    assert -0.014 * 1.3 < lo1 / 1000 - p < -0.014 / 1.6
    assert 0.5 * 0.010 < (hi1 + 1) / 1000 - p <= 0.010
    assert lo10 / 10_000 - p == pytest.approx(-0.0032, rel=0.2)
    assert (hi10 + 1) / 10_000 - p == pytest.approx(0.0028, rel=0.2)
    assert count_bounds(1000, p, 0.05, t_opt=10_000)[1] == 1000


def test_min_samples_for_finite_monotone_in_alpha() -> None:
    for p in [0.5, 0.9, 0.99]:
        ns = [min_samples_for_finite(p, a) for a in [0.2, 0.1, 0.05, 0.01, 0.001, 1e-4]]
        assert ns == sorted(ns), (p, ns)
    assert min_samples_for_finite(0.99, 0.05) > 368  # fixed-n 95% needs 368; anytime costs more


@pytest.mark.parametrize(("p", "alpha", "t_opt"), [(0.99, 0.02 / 12, None), (0.9, 0.01, 2000)])
def test_min_samples_for_finite_is_a_threshold(p: float, alpha: float, t_opt: int | None) -> None:
    n = min_samples_for_finite(p, alpha, t_opt)

    def finite(t: int) -> bool:
        k_lo, k_hi = count_bounds(t, p, alpha, t_opt)
        return k_lo >= 1 and k_hi < t

    assert not finite(n - 1)
    assert all(finite(t) for t in range(n, n + 100))


def test_fast_at_a_million() -> None:
    start = time.perf_counter()
    k_lo, k_hi = count_bounds(1_000_000, 0.99, 0.001, t_opt=5000)
    assert time.perf_counter() - start < 1.0
    assert k_lo < 990_000 < k_hi


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="p must be"):
        count_bounds(10, 1.0, 0.05)
    with pytest.raises(ValueError, match="alpha must be"):
        quantile_cs(np.arange(3.0), 0.5, 0.0)
