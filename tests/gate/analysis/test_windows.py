"""Regressions in time (windows.py, judge v3): the scan over runs of blocks (a stall, a slow
stretch) and the creep (a line through the blocks, judged where it ends).

The block series here stand for the p50 check's statistics (a block's trimmed mean of the
pairs' log ratios): noise of sd 0.03 per block is about a pair's log-ratio sd of 0.3 over 100
requests a block."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate.analysis.paired import MIN_TEST_BLOCKS
from gate.analysis.windows import creep_test, window_test, window_widths

ALPHA, BETA = 0.001875, 0.05  # a latency check's share of the default budget
WINDOW = math.log(1.5)  # window_tolerance 0.5
CREEP = math.log(1.1)  # creep_tolerance 0.10
SEEDS = range(40)


def noise(seed: int, m: int = 32, sd: float = 0.03) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, sd, m)


def test_window_widths_double_up_to_half_the_blocks() -> None:
    assert window_widths(32) == (1, 2, 4, 8, 16)
    assert window_widths(31) == (1, 2, 4, 8)
    assert window_widths(7) == (1, 2)
    assert window_widths(1) == ()


def test_a_slow_quarter_fails_the_window() -> None:
    """8 consecutive blocks of 32 at x2: the run's mean is log 2, well above log 1.5 with
    confidence, and the run found is the slow one."""
    for seed in SEEDS:
        x = noise(seed)
        x[12:20] += math.log(2.0)
        w = window_test(x, ALPHA, BETA)
        assert w.lower > WINDOW + 0.01, (seed, w)  # at least 0.56 over 200 seeds, against 0.405
        assert (w.start, w.width) == (12, 8)
        assert w.mean == pytest.approx(math.log(2.0), abs=0.05)
        assert w.blocks == 32 and w.runs == sum(32 - k + 1 for k in window_widths(32))


def test_a_single_block_stall_fails_the_window() -> None:
    """One block of 32 at x10 (a stall of seconds): a run of one block fails."""
    for seed in SEEDS:
        x = noise(seed)
        x[20] += math.log(10.0)
        w = window_test(x, ALPHA, BETA)
        assert w.lower > WINDOW + 0.5, (seed, w)  # at least 2.0 over 200 seeds
        assert (w.start, w.width) == (20, 1)


def test_noise_alone_passes_the_window_and_never_fails_it() -> None:
    """No run of noise is shown slower than x1.5; with noise of 0.03 per block nearly every
    gate shows every run below it (passes)."""
    passed = 0
    for seed in SEEDS:
        w = window_test(noise(seed), ALPHA, BETA)
        assert w.lower < WINDOW - 0.2, (seed, w)  # at most 0.0 over 200 seeds
        passed += w.upper < WINDOW
    assert passed >= 0.9 * len(SEEDS)  # 200 of 200 seeds


def test_a_fast_window_is_not_a_regression() -> None:
    """One-sided: a run of blocks where the candidate is twice as fast never fails."""
    for seed in range(10):
        x = noise(seed)
        x[12:20] -= math.log(2.0)
        assert window_test(x, ALPHA, BETA).lower < 0.0


def test_too_few_blocks_scan_nothing() -> None:
    w = window_test(noise(0, m=MIN_TEST_BLOCKS + 1), ALPHA, BETA)
    assert w.runs == 0 and w.lower == -math.inf and w.upper == math.inf
    assert window_test(noise(0, m=MIN_TEST_BLOCKS + 2), ALPHA, BETA).runs > 0


def ramp(m: int = 32, to: float = math.log(1.4)) -> np.ndarray:
    """Flat for the first half, then rising linearly to `to` at the last block."""
    out = np.zeros(m)
    out[m // 2 :] = np.linspace(0.0, to, m - m // 2)
    return out


def test_a_creep_over_the_second_half_fails() -> None:
    """A slowdown that sets in mid-way and reaches x1.4 at the end: its average is only x1.09,
    but where it got to is above x1.1 with confidence."""
    for seed in SEEDS:
        x = noise(seed) + ramp()
        assert float(np.mean(ramp())) < CREEP
        c = creep_test(x, ALPHA, BETA)
        assert c.lower > CREEP + 0.03, (seed, c)  # at least 0.2 over 200 seeds, against 0.095
        assert c.lower <= c.end <= c.upper and c.slope > 0.0
        assert c.end == pytest.approx(math.log(1.4), abs=0.1)


def test_flat_noise_passes_the_creep() -> None:
    passed = 0
    for seed in SEEDS:
        c = creep_test(noise(seed), ALPHA, BETA)
        assert c.lower < CREEP - 0.05, (seed, c)  # at most 0.0 over 200 seeds
        passed += c.upper < CREEP
    assert passed >= 0.9 * len(SEEDS)  # 199 of 200 seeds


def test_a_steady_shift_is_not_a_creep_above_itself() -> None:
    """A steady x1.05 (within the creep tolerance) ends where it started: no creep fails."""
    for seed in range(10):
        c = creep_test(noise(seed) + math.log(1.05), ALPHA, BETA)
        assert c.lower < CREEP
        assert c.end == pytest.approx(math.log(1.05), abs=0.05)


def test_too_few_blocks_fit_no_line() -> None:
    c = creep_test(noise(0, m=MIN_TEST_BLOCKS + 1), ALPHA, BETA)
    assert math.isnan(c.end) and c.lower == -math.inf and c.upper == math.inf
    assert math.isfinite(creep_test(noise(0, m=MIN_TEST_BLOCKS + 2), ALPHA, BETA).end)
