"""Betting confidence sequences for paired differences: coverage over looks, decisions, edges."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from gate.analysis.bounded import paired_mean_cs


def _pairs(rng: np.random.Generator, n: int, p_ref: float, p_cand: float) -> np.ndarray:
    return (rng.random(n) < p_cand).astype(float) - (rng.random(n) < p_ref).astype(float)


def test_covers_the_mean_at_every_prefix() -> None:
    """The bound holds for all prefixes at once: checking many looks does not inflate misses."""
    rng = np.random.default_rng(1)
    runs, n, alpha = 100, 1_000, 0.1
    looks = [100, 200, 400, 1_000]
    misses = 0
    for _ in range(runs):
        d = _pairs(rng, n, 0.9, 0.9)
        for t in looks:
            lo, hi = paired_mean_cs(d[:t], alpha / 2.0)
            if not lo <= 0.0 <= hi:
                misses += 1
                break
    assert misses <= binom.ppf(0.999, runs, alpha)


def test_finds_a_real_difference_and_bounds_a_small_one() -> None:
    rng = np.random.default_rng(2)
    lo, hi = paired_mean_cs(_pairs(rng, 4_000, 0.95, 0.85), 0.005)
    assert hi < -0.05 < lo + 0.1
    lo, hi = paired_mean_cs(_pairs(rng, 4_000, 0.95, 0.95), 0.005)
    assert -0.03 < lo <= 0.0 <= hi < 0.03


def test_edges() -> None:
    assert paired_mean_cs(np.zeros(0), 0.05) == (-1.0, 1.0)
    lo, hi = paired_mean_cs(np.ones(200), 0.05)
    assert lo > 0.85 and hi == 1.0
    with pytest.raises(ValueError, match="lie in"):
        paired_mean_cs(np.array([2.0]), 0.05)
    with pytest.raises(ValueError, match="alpha"):
        paired_mean_cs(np.zeros(3), 0.0)
