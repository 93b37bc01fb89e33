"""The tail check's test (tails.py, judge v3): per level of the slowest requests, the log tail
scale of the candidate against the reference, with a jackknife over pairs of time blocks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate.analysis.paired import MIN_TEST_BLOCKS, Layout, t_quantile
from gate.analysis.tails import GROUP, LEVELS, MIN_TAIL, SHOWN_TAIL, tail_scale

ALPHA, BETA = 0.0025, 0.05  # about a tail check's share of the default budget
THETA = math.log(1.10)  # the default tail tolerance, on the log scale


def blocks(n: int, rate: float = 20.0) -> tuple[np.ndarray, int]:
    lay = Layout.build(n, times=np.arange(n) / rate)
    return lay.index(np.arange(n)), lay.planned_blocks


def engines(
    seed: int, n: int, slow_share: float = 0.0, factor: float = 4.0
) -> tuple[np.ndarray, np.ndarray]:
    """Mirrored engines: a latency both share (the prompt, the load) times each engine's own
    noise; the candidate's `slow_share` of requests, chosen at random, `factor` times slower."""
    rng = np.random.default_rng(seed)
    common = rng.lognormal(math.log(100.0), 0.5, n)
    ref = common * rng.lognormal(0.0, 0.2, n)
    cand = common * rng.lognormal(0.0, 0.2, n)
    if slow_share:
        cand = np.where(rng.uniform(size=n) < slow_share, cand * factor, cand)
    return ref, cand


@pytest.mark.parametrize("k", [0.8, 1.0, 1.3, 3.0])
def test_a_scaled_candidate_has_tail_scale_k_at_every_level(k: float) -> None:
    """A candidate whose every request is k times the reference's has d_u = log k at every
    level, and every jackknife replicate agrees, so its bounds are log k too."""
    block, m = blocks(2_000)
    ref = np.random.default_rng(1).lognormal(4.0, 0.4, 2_000)
    ts = tail_scale(ref, ref * k, block, m, ALPHA, BETA)
    assert [t.level for t in ts.levels] == list(LEVELS)
    for t in ts.levels:
        assert t.estimate == pytest.approx(math.log(k), abs=1e-9)
        assert t.lower == pytest.approx(math.log(k), abs=1e-9)
        assert t.upper == pytest.approx(math.log(k), abs=1e-9)
    assert ts.groups == m // GROUP


def test_aa_tail_scale_is_near_one_and_never_fails() -> None:
    """Identical engines: every level's log tail scale is near 0 and inside its interval, and
    no level's lower bound reaches the tolerance."""
    block, m = blocks(8_000)
    for seed in range(10):
        ts = tail_scale(*engines(seed, 8_000), block, m, ALPHA, BETA)
        assert len(ts.levels) == len(LEVELS) and ts.finite
        for t in ts.levels:
            assert abs(t.estimate) < 0.15, (seed, t)  # measured at most 0.08 over 30 seeds
            assert t.lower <= t.estimate <= t.upper
        assert ts.lower < THETA - 0.05, (seed, ts.lower)  # measured at most -0.02


def test_three_percent_of_requests_four_times_slower_fail_the_tail() -> None:
    """3% of the candidate's requests 4x slower move neither a median nor a block mean much,
    but the slowest 1-2% of the candidate are all from the slowed share: the finer levels put
    the tail scale above 1.10 with confidence."""
    block, m = blocks(8_000)
    for seed in range(10):
        ts = tail_scale(*engines(seed, 8_000, slow_share=0.03), block, m, ALPHA, BETA)
        assert ts.lower > THETA + 0.05, (seed, ts.lower)  # measured at least 0.24 over 30 seeds
        assert ts.decider.level <= 0.02
        assert ts.decider.lower <= ts.decider.estimate <= ts.decider.upper


def test_the_bounds_are_one_sided_t_bounds_on_the_jackknife_spread() -> None:
    """Each level at a share of alpha and beta (a union bound over the levels), t on the
    groups - 1 degrees of freedom: the hold-side and pass-side distances from the estimate are
    in the ratio of their t quantiles, and a smaller alpha moves the lower bound down."""
    block, m = blocks(4_000)
    ref, cand = engines(3, 4_000)
    ts = tail_scale(ref, cand, block, m, ALPHA, BETA)
    g = ts.groups
    a, b = ALPHA / len(LEVELS), BETA / len(LEVELS)
    for t in ts.levels:
        down, up = t.estimate - t.lower, t.upper - t.estimate
        assert down > 0 and up > 0
        assert down / up == pytest.approx(t_quantile(a, g - 1) / t_quantile(b, g - 1))
    tighter = tail_scale(ref, cand, block, m, ALPHA / 10, BETA)
    for t, u in zip(ts.levels, tighter.levels, strict=True):
        assert u.lower < t.lower and u.upper == pytest.approx(t.upper)
        assert u.estimate == t.estimate


def test_a_level_with_too_few_requests_is_not_shown() -> None:
    """At 1,000 pairs the slowest 1% and 0.5% are 10 and 5 requests, under SHOWN_TAIL: where
    they are tested at all they can fail the check, but their upper bounds do not keep it
    from passing."""
    block, m = blocks(1_000, rate=5.0)
    ts = tail_scale(*engines(4, 1_000), block, m, ALPHA, BETA)
    by_level = {t.level: t for t in ts.levels}
    assert by_level[0.05].tail_requests == 50
    for t in ts.levels:
        assert t.tail_requests == max(MIN_TAIL, round(t.level * 1_000))
    assert {t.level for t in ts.shown} == {
        t.level for t in ts.levels if t.level * 1_000 >= SHOWN_TAIL
    }
    assert 0.01 not in {t.level for t in ts.shown} and 0.005 not in {t.level for t in ts.shown}
    assert ts.upper == max(t.upper for t in ts.shown)
    assert ts.lower == max(t.lower for t in ts.levels)


def test_too_few_blocks_test_nothing_and_a_level_needs_two_requests_in_its_tail() -> None:
    """Fewer than MIN_TEST_BLOCKS groups of blocks: no level is tested. Otherwise each level is
    tested where its tail holds MIN_TAIL requests (6cd6144: not only from 800 pairs on): at
    300 pairs the slowest 0.5% is 1.5 requests, so that level alone is left out, and each
    tested level keeps its fixed share of alpha."""
    block, _ = blocks(4_000)
    ref, cand = engines(5, 4_000)
    short = tail_scale(ref, cand, block, GROUP * MIN_TEST_BLOCKS - 1, ALPHA, BETA)
    assert short.levels == () and not short.finite
    few = 300
    fb, fm = blocks(few, rate=1.0)
    assert fm // GROUP >= MIN_TEST_BLOCKS
    ts = tail_scale(ref[:few], cand[:few], fb, fm, ALPHA, BETA)
    assert [t.level for t in ts.levels] == [u for u in LEVELS if u * few >= MIN_TAIL]
    assert 0.005 not in {t.level for t in ts.levels}
    assert min(t.tail_requests for t in ts.levels) >= MIN_TAIL
    assert ts.shown == tuple(t for t in ts.levels if t.tail_requests >= SHOWN_TAIL)
