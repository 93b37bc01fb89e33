"""Harrell-Davis estimates: agreement with scipy, equivariance, the subsampling cap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats.mstats import hdquantiles

from gate.analysis import estimates
from gate.analysis.estimates import (
    bootstrap_ratio_intervals,
    hd_quantile,
    hd_quantiles,
    quantile_ratio,
)

PROBS = [0.01, 0.1, 0.5, 0.9, 0.99]


@pytest.mark.parametrize("n", [2, 3, 5, 10, 37, 200])
def test_matches_scipy_hdquantiles(n: int) -> None:
    x = np.random.default_rng(n).lognormal(0.0, 0.8, n)
    expected = np.asarray(hdquantiles(x, prob=PROBS))
    np.testing.assert_allclose(hd_quantiles(x, PROBS), expected, rtol=1e-12)


def test_order_of_input_does_not_matter() -> None:
    x = np.random.default_rng(1).normal(size=50)
    assert hd_quantile(x, 0.9) == pytest.approx(hd_quantile(np.sort(x)[::-1], 0.9), rel=1e-14)


def test_ratio_is_scale_equivariant() -> None:
    x = np.random.default_rng(2).lognormal(size=300)
    y = np.random.default_rng(3).lognormal(size=250)
    assert quantile_ratio(x, 1.5 * x, 0.9) == pytest.approx(1.5, rel=1e-12)
    assert quantile_ratio(x, y, 0.5) == pytest.approx(hd_quantile(y, 0.5) / hd_quantile(x, 0.5))
    assert math.isnan(quantile_ratio(np.zeros(5), y, 0.5))


def test_cap_subsamples_deterministically(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(4).lognormal(0.0, 0.5, 20_000)
    full = hd_quantiles(x, [0.5, 0.99])
    monkeypatch.setattr(estimates, "MAX_HD_SAMPLES", 2_000)
    thinned = hd_quantiles(x, [0.5, 0.99])
    np.testing.assert_array_equal(thinned, hd_quantiles(x, [0.5, 0.99]))
    np.testing.assert_allclose(thinned, full, rtol=0.01)


def test_rejects_empty_and_non_finite() -> None:
    with pytest.raises(ValueError, match="at least one"):
        hd_quantile(np.zeros(0), 0.5)
    with pytest.raises(ValueError, match="finite"):
        hd_quantile(np.array([1.0, np.nan]), 0.5)
    assert hd_quantile(np.array([3.0]), 0.9) == 3.0


def _batched(rng: np.random.Generator, n: int, batch: int = 25) -> np.ndarray:
    """Lognormal latencies where each run of `batch` requests shares a strong factor."""
    shared = np.repeat(rng.normal(0.0, 0.4, n // batch + 1), batch)[:n]
    return np.exp(rng.normal(0.0, 0.2, n) + shared)


def test_block_bootstrap_covers_the_ratio_under_batch_effects() -> None:
    """Equal distributions with batch effects: the true ratio is 1 at every quantile. Blocks of
    sqrt(n) keep each batch whole, so coverage stays near nominal where an i.i.d. bootstrap
    (blocks of one, emulated by shuffling first) misses far more often."""
    runs, n = 80, 2_500
    probs = [0.5, 0.9]
    misses_block = np.zeros(2)
    misses_iid = np.zeros(2)
    rng = np.random.default_rng(11)
    for r in range(runs):
        x, y = _batched(rng, n), _batched(rng, n)
        block = bootstrap_ratio_intervals(x, y, probs, seed=r)
        iid = bootstrap_ratio_intervals(rng.permutation(x), rng.permutation(y), probs, seed=r)
        for j in range(2):
            lo, hi = block[j] or (np.nan, np.nan)
            misses_block[j] += not lo <= 1.0 <= hi
            lo, hi = iid[j] or (np.nan, np.nan)
            misses_iid[j] += not lo <= 1.0 <= hi
    assert (misses_block / runs <= 0.15).all(), misses_block / runs
    assert misses_iid.sum() > misses_block.sum()


def test_bootstrap_interval_surrounds_the_estimate_and_is_reproducible() -> None:
    rng = np.random.default_rng(3)
    x = rng.lognormal(0.0, 0.5, 3_000)
    y = 1.2 * rng.lognormal(0.0, 0.5, 3_000)
    first = bootstrap_ratio_intervals(x, y, [0.5, 0.99])
    assert first == bootstrap_ratio_intervals(x, y, [0.5, 0.99])
    for (lo, hi), p in zip([iv for iv in first if iv], [0.5, 0.99], strict=True):
        assert lo < quantile_ratio(x, y, p) < hi
    lo, hi = first[0] or (0.0, 0.0)
    assert lo < 1.2 < hi


def test_time_blocks_are_used_when_send_times_are_given() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.lognormal(size=2_000), rng.lognormal(size=2_000)
    t = np.sort(rng.uniform(0.0, 600.0, 2_000))
    timed = bootstrap_ratio_intervals(x, y, [0.5], ref_offsets_s=t, cand_offsets_s=t)
    plain = bootstrap_ratio_intervals(x, y, [0.5])
    assert timed[0] is not None and plain[0] is not None
    assert timed != plain
    # Too short a span for ten blocks falls back to blocks of sqrt(n) samples.
    same = bootstrap_ratio_intervals(
        x, y, [0.5], ref_offsets_s=np.zeros(2_000), cand_offsets_s=np.zeros(2_000)
    )
    assert same == plain


def test_bootstrap_needs_samples() -> None:
    assert bootstrap_ratio_intervals(np.ones(5), np.ones(500), [0.5]) == [None]
    with pytest.raises(ValueError, match="level"):
        bootstrap_ratio_intervals(np.ones(50), np.ones(50), [0.5], level=1.0)
