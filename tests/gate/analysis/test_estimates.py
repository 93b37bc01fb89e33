"""Harrell-Davis estimates: agreement with scipy, equivariance, the subsampling cap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats.mstats import hdquantiles

from gate.analysis import estimates
from gate.analysis.estimates import hd_quantile, hd_quantiles, quantile_ratio

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
