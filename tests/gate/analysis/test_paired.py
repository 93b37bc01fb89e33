"""The paired comparison over blocks in time (judge v3, issue 28): its pieces exactly (the
layout of blocks, the long-run variance, the one-sided level test, the spending over planned
looks, the planning figures), and its error rate under the dependence real engines have
(requests that share batches, a load both engines share)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.stats import binom

from gate.analysis.paired import (
    BLOCKS_TARGET,
    MIN_BLOCK_REQUESTS,
    MIN_BLOCK_S,
    MIN_BLOCKS,
    MIN_TEST_BLOCKS,
    PHI_MAX,
    POWER_Z,
    SPEND_POWER,
    Layout,
    block_quantiles,
    block_trimmed_means,
    correlation_time,
    detectable_shift,
    join,
    level_test,
    long_run,
    look_levels,
    planned_shift,
    size_to_detect,
    spread_factor,
    t_quantile,
)
from gate.analysis.tails import tail_scale

# --- Layout: blocks fixed from the schedule before any sample ---------------------------------


def test_without_times_blocks_are_equal_request_counts() -> None:
    """Without send offsets the blocks are counted in requests: BLOCKS_TARGET of them over the
    planned size, never fewer than MIN_BLOCK_REQUESTS requests each; a short trailing block
    (under half a block) joins the one before."""
    big = Layout.build(20_000)
    assert big.edges == tuple(range(0, 20_001, 625))
    assert big.planned_blocks == BLOCKS_TARGET and big.block_s is None
    assert big.describe() == "32 blocks of about 625 requests"
    # 1,000 / 32 is under MIN_BLOCK_REQUESTS: blocks of 32, the trailing 8 join the last one.
    small = Layout.build(1_000)
    assert small.edges[:3] == (0, 32, 64) and small.edges[-2:] == (960, 1_000)
    assert small.planned_blocks == 31 == len(small.edges) - 1
    assert set(np.diff(small.edges[:-1]).tolist()) == {MIN_BLOCK_REQUESTS}
    assert small.per_block() == pytest.approx(1_000 / 31)
    # A trailing block of at least half a block stays a block of its own.
    assert Layout.build(1_016).edges[-2:] == (992, 1_016)
    assert Layout.build(1_007).edges[-2:] == (960, 1_007)
    # Too few requests for a block: one block, the whole scenario.
    assert Layout.build(5).edges == (0, 5) and Layout.build(5).planned_blocks == 1
    assert Layout.build(0).edges == (0, 1), "the planned size is at least one request"


def test_blocks_in_time_target_the_planned_duration() -> None:
    """With the schedule's intended send offsets, blocks are spans of time: the planned
    duration over BLOCKS_TARGET, so at 20 requests/s for 200 s, 32 blocks of 6.25 s (125
    requests each)."""
    times = np.arange(4_000) / 20.0
    lay = Layout.build(4_000, times=times)
    assert lay.planned_blocks == BLOCKS_TARGET and lay.limit == 4_000
    assert lay.block_s == pytest.approx((times[-1] - times[0]) / BLOCKS_TARGET)
    assert lay.edges == tuple(range(0, 4_001, 125))
    assert lay.describe() == "32 blocks of 6.25 s (about 125 requests)"
    # Only the planned requests' offsets count: the extension's do not move the blocks.
    longer = np.concatenate([times, 200.0 + np.arange(1_000) / 20.0])
    assert Layout.build(4_000, times=longer) == lay


def test_a_block_lasts_at_least_min_block_s_and_holds_at_least_min_block_requests() -> None:
    """A fast short scenario gets blocks of MIN_BLOCK_S seconds, not 32 blocks of 0.2 s; a slow
    one gets blocks of MIN_BLOCK_REQUESTS requests, however long they last."""
    fast = Layout.build(600, times=np.arange(600) / 100.0)
    assert fast.block_s == MIN_BLOCK_S
    assert fast.edges == (0, 200, 400, 600), "three blocks of 2 s at 100 requests/s"
    slow = Layout.build(300, times=np.arange(300) / 2.0)
    assert slow.block_s == pytest.approx(MIN_BLOCK_REQUESTS / 2.0)
    assert np.diff(slow.edges).min() >= MIN_BLOCK_REQUESTS
    assert slow.edges[:3] == (0, 32, 64) and slow.planned_blocks == 9


def test_blocks_follow_the_clock_not_the_count() -> None:
    """Arrivals at 40/s for 50 s, then 10/s for 100 s: blocks are equal spans of time, so the
    busy first third has four times as many requests per block as the rest; every block
    starts at the first request of its span of block_s seconds."""
    times = np.concatenate([np.arange(2_000) / 40.0, 50.0 + np.arange(1_000) / 10.0])
    lay = Layout.build(3_000, times=times)
    assert lay.block_s is not None
    counts = np.diff(lay.edges)
    assert counts[0] == pytest.approx(4 * counts[-1], rel=0.05)
    assert counts.min() >= MIN_BLOCK_REQUESTS
    bins = np.floor((times - times[0]) / lay.block_s).astype(int)
    for edge in lay.edges[1:-1]:
        assert bins[edge] > bins[edge - 1], "an edge is where a new span of time begins"


def test_a_lull_joins_the_next_block() -> None:
    """A time span with fewer than half of MIN_BLOCK_REQUESTS requests (a lull in the
    arrivals) is not a block of its own: it joins the next one."""
    times = np.concatenate([np.arange(600) / 20.0, 34.5 + np.arange(5) * 0.1])
    times = np.concatenate([times, 60.0 + np.arange(600) / 20.0])
    lay = Layout.build(times.size, times=times)
    assert lay.block_s is not None
    counts = np.diff(lay.edges)
    assert counts.min() >= MIN_BLOCK_REQUESTS // 2
    lull = int(np.searchsorted(lay.edges, 600, side="right")) - 1
    assert lay.edges[lull] <= 600 < 605 <= lay.edges[lull + 1], "the 5 lull requests joined"


def test_a_short_trailing_block_joins_the_one_before() -> None:
    """1,010 requests at 100/s: blocks of 2 s (200 requests) and a last span of 10 requests,
    under half a block, which joins the last full block."""
    lay = Layout.build(1_010, times=np.arange(1_010) / 100.0)
    assert lay.block_s == MIN_BLOCK_S
    assert lay.edges == (0, 200, 400, 600, 800, 1_010)
    assert lay.planned_blocks == 5


@pytest.mark.parametrize("timed", [False, True])
def test_extension_blocks_run_to_the_limit(timed: bool) -> None:
    """Past the planned size (policy extend) blocks of the same mean size run to the limit;
    the planned blocks do not change, and no extension block is under half a block."""
    times = np.arange(1_000) / 20.0 if timed else None
    planned = Layout.build(1_000, times=times)
    lay = Layout.build(1_000, 1_500, times=times)
    assert lay.edges[: lay.planned_blocks + 1] == planned.edges
    assert lay.planned_blocks == planned.planned_blocks
    assert lay.edges[lay.planned_blocks] == 1_000 and lay.limit == 1_500
    per = 32 if not timed else round(lay.block_s * 20.0)  # type: ignore[operator]
    ext = np.diff(lay.edges[lay.planned_blocks :])
    assert ext.size >= 1 and (ext[:-1] == per).all()
    assert per // 2 <= ext[-1] < per + per // 2
    # A limit below the planned size is the planned size.
    assert Layout.build(1_000, 10).limit == 1_000


def test_bad_times_fall_back_to_request_counts() -> None:
    """Offsets that span no time or are not finite say nothing about time: blocks in counts."""
    assert Layout.build(1_000, times=np.zeros(1_000)) == Layout.build(1_000)
    bad = np.arange(1_000) / 20.0
    bad[10] = math.nan
    assert Layout.build(1_000, times=bad) == Layout.build(1_000)


def test_complete_and_index() -> None:
    """complete(n): the blocks wholly inside the first n requests; index(ids): each id's block,
    ids past the limit one past the last block."""
    lay = Layout.build(1_000, 1_100)
    last = len(lay.edges) - 1
    assert lay.complete(0) == 0 and lay.complete(31) == 0
    assert lay.complete(32) == 1 and lay.complete(63) == 1 and lay.complete(64) == 2
    assert lay.complete(1_000) == lay.planned_blocks
    assert lay.complete(1_100) == last == lay.complete(5_000)
    ids = np.array([0, 31, 32, 999, 1_000, 1_099, 1_100, 7_000])
    assert lay.index(ids).tolist() == [0, 0, 1, 30, 31, last - 1, last, last]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 20_000),
    rate=st.floats(0.5, 200.0),
    poisson=st.booleans(),
    extend=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_layout_invariants(n: int, rate: float, poisson: bool, extend: float, seed: int) -> None:
    """Whatever the schedule: edges increase from 0 to the limit, the planned size is an edge,
    every planned block but a lone one holds at least MIN_BLOCK_REQUESTS / 2 requests, blocks
    in time last at least MIN_BLOCK_S, and index and complete agree with the edges."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n) if poisson else np.full(n, 1.0 / rate)
    times = np.cumsum(gaps)
    limit = n + math.ceil(n * extend)
    lay = Layout.build(n, limit, times=times)
    edges = np.asarray(lay.edges)
    assert edges[0] == 0 and edges[-1] == limit and (np.diff(edges) > 0).all()
    assert lay.edges[lay.planned_blocks] == n
    if lay.planned_blocks > 1:
        assert np.diff(edges[: lay.planned_blocks + 1]).min() >= MIN_BLOCK_REQUESTS // 2
    if lay.block_s is not None:
        assert lay.block_s >= MIN_BLOCK_S
    ids = np.arange(limit)
    block = lay.index(ids)
    assert (np.bincount(block) == np.diff(edges)).all()
    assert lay.complete(limit) == len(edges) - 1


# --- Joining and block statistics ----------------------------------------------------------


def test_join_pairs_by_schedule_id_and_drops_one_sided_errors() -> None:
    ref = np.array([10.0, 11.0, 12.0, 13.0])
    ref_ids = np.array([0, 1, 2, 4])
    cand = np.array([20.0, 24.0, 21.0])
    cand_ids = np.array([0, 4, 1])  # out of order, request 2 failed on the candidate
    r, c, ids = join(ref, ref_ids, cand, cand_ids)
    assert ids.tolist() == [0, 1, 4]
    assert r.tolist() == [10.0, 11.0, 13.0] and c.tolist() == [20.0, 21.0, 24.0]
    r, c, ids = join(ref, None, cand, None)
    assert ids.tolist() == [0, 1, 2]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(k=st.floats(0.5, 3.0), seed=st.integers(0, 2**31 - 1), q=st.sampled_from([0.5, 0.9]))
def test_a_scaled_candidate_moves_every_block_by_log_k(k: float, seed: int, q: float) -> None:
    rng = np.random.default_rng(seed)
    ref = rng.lognormal(4.0, 0.5, 320)
    lay = Layout.build(320)
    block = lay.index(np.arange(320))
    m = lay.planned_blocks
    assert m == 10
    got = (
        block_trimmed_means(ref, ref * k, block, m)
        if q == 0.5
        else block_quantiles(ref, ref * k, block, m, q)
    )
    assert got.size == 10
    assert np.allclose(got, math.log(k))


def test_block_statistics_are_the_trimmed_mean_and_the_quantile_ratio_per_block() -> None:
    """p50: each block's 20%-trimmed mean of the pairs' log ratios; other quantiles: the log
    ratio of the two engines' block quantiles; an empty block is NaN."""
    rng = np.random.default_rng(4)
    ref, cand = rng.lognormal(4.0, 0.4, 256), rng.lognormal(4.1, 0.4, 256)
    block = np.repeat(np.arange(8), 32)
    x = np.log(cand) - np.log(ref)
    want = stats.trim_mean(x.reshape(8, 32), 0.2, axis=1)
    assert np.allclose(block_trimmed_means(ref, cand, block, 8), want)
    q90 = np.log(np.quantile(cand.reshape(8, 32), 0.9, axis=1)) - np.log(
        np.quantile(ref.reshape(8, 32), 0.9, axis=1)
    )
    assert np.allclose(block_quantiles(ref, cand, block, 8, 0.9), q90)
    with_empty = block_trimmed_means(ref, cand, block, 9)
    assert np.isnan(with_empty[8]) and np.allclose(with_empty[:8], want)


# --- The long-run variance ------------------------------------------------------------------


def ar1(rng: np.random.Generator, m: int, phi: float) -> np.ndarray:
    x = np.empty(m)
    x[0] = rng.normal(0.0, 1.0 / math.sqrt(1.0 - phi * phi))
    e = rng.normal(size=m)
    for i in range(1, m):
        x[i] = phi * x[i - 1] + e[i]
    return x


def test_detrending_takes_a_linear_trend_out_of_the_variance() -> None:
    """A creeping series is not noise: its detrended long-run sd is that of the residuals, and
    the fitted line is returned; left in, the trend inflates the spread many times."""
    k = np.arange(32, dtype=np.float64)
    line = 0.1 + 0.02 * k
    exact = long_run(line)
    assert exact.slope == pytest.approx(0.02) and exact.intercept == pytest.approx(0.1)
    assert exact.mean == pytest.approx(0.1 + 0.02 * 15.5)
    assert exact.sd < 1e-9 and exact.phi == 0.0 and exact.df == 30
    rng = np.random.default_rng(2)
    noise = rng.normal(0.0, 0.01, 32)
    detrended = long_run(line + noise)
    assert detrended.slope == pytest.approx(0.02, abs=0.002)
    kept = long_run(line + noise, detrend=False)
    assert kept.df == 31 and kept.slope == 0.0
    assert kept.sd > 10 * detrended.sd
    assert detrended.sd == pytest.approx(long_run(noise).sd, rel=0.05)


def test_the_long_run_sd_is_the_residual_variance_times_the_ar1_factor() -> None:
    rng = np.random.default_rng(3)
    x = ar1(rng, 32, 0.5)
    lr = long_run(x)
    k = np.arange(32) - 15.5
    resid = x - x.mean() - lr.slope * k
    var = float(resid @ resid) / 30
    assert lr.sd == pytest.approx(math.sqrt(var * (1 + lr.phi) / (1 - lr.phi)))
    assert 0.0 <= lr.phi <= PHI_MAX


def test_phi_is_near_zero_for_independent_blocks_and_clearly_positive_for_ar1() -> None:
    """The credited lag-1 autocorrelation (bias-corrected, floored at 0): near 0 for
    independent blocks, near 0.8 for a long AR(1) of 0.8, and for 32 blocks of it (where the
    estimate is biased low) still far above what independent blocks give."""
    rng = np.random.default_rng(1)
    for _ in range(3):
        assert long_run(rng.normal(size=2_000)).phi < 0.05
        assert long_run(ar1(rng, 2_000, 0.8)).phi == pytest.approx(0.8, abs=0.06)
    iid = [long_run(rng.normal(size=32)).phi for _ in range(300)]
    dep = [long_run(ar1(rng, 32, 0.8)).phi for _ in range(300)]
    assert float(np.mean(iid)) < 0.1  # measured 0.05: the floor at 0 biases it up a little
    assert float(np.mean(dep)) > 0.45  # measured 0.66
    assert float(np.median(dep)) > 5 * float(np.median(iid)) + 0.4


def test_phi_is_capped() -> None:
    """A drift that spans the whole series (a slow wave, a random walk) is credited PHI_MAX at
    most: the variance is widened (1 + PHI_MAX) / (1 - PHI_MAX) = 19 times, no more."""
    k = np.arange(32)
    assert long_run(np.sin(2 * np.pi * k / 32)).phi == PHI_MAX
    walk = np.cumsum(np.random.default_rng(5).normal(size=200))
    assert long_run(walk).phi == PHI_MAX
    assert long_run(walk, robust=True).phi <= PHI_MAX


def test_too_short_a_series_has_no_long_run_sd() -> None:
    lr = long_run(np.array([0.1, 0.2]))
    assert math.isnan(lr.sd) and lr.df == 0 and lr.phi == 0.0
    assert lr.mean == pytest.approx(0.15)


def test_the_robust_long_run_sd_does_not_grow_with_a_slow_window() -> None:
    """robust (Qn, Theil-Sen): a quarter of the blocks moved by a regression moves the robust
    spread a bounded amount, the same whether the window is x2 or x20, where the classical sd
    grows with the regression itself; on clean blocks the two are alike, the robust one on
    fewer degrees of freedom (ROBUST_EFFICIENCY)."""
    from gate.analysis.paired import ROBUST_EFFICIENCY

    for seed in range(5):
        x = np.random.default_rng(seed).normal(0.0, 0.03, 32)
        clean_c, clean_r = long_run(x), long_run(x, robust=True)
        assert clean_r.sd == pytest.approx(clean_c.sd, rel=0.6)
        assert clean_r.df == math.floor(ROBUST_EFFICIENCY * 30) < clean_c.df
        sds = {}
        for factor in (2.0, 20.0):
            y = x.copy()
            y[12:20] += math.log(factor)
            sds[factor] = (long_run(y).sd, long_run(y, robust=True).sd)
        assert sds[2.0][0] > 20 * clean_c.sd, "the classical sd reads the window as noise"
        assert sds[20.0][0] > 4 * sds[2.0][0]
        assert sds[20.0][1] == pytest.approx(sds[2.0][1], rel=0.05)
        assert sds[2.0][1] < sds[2.0][0] / 5


def test_correlation_time() -> None:
    """(1 + phi) / (1 - phi) blocks: 1 for independent blocks; negative phi counts as 0."""
    assert correlation_time(0.0) == 1.0
    assert correlation_time(-0.3) == 1.0
    assert correlation_time(0.8) == pytest.approx(9.0)
    assert correlation_time(PHI_MAX) == pytest.approx(19.0)
    assert math.isfinite(correlation_time(1.0))


# --- The one-sided test and the spending over looks -----------------------------------------


def test_t_quantile_is_the_one_sided_upper_quantile() -> None:
    assert t_quantile(0.05, 10) == pytest.approx(stats.t.isf(0.05, 10))
    assert t_quantile(0.001, 30) == pytest.approx(stats.t.ppf(0.999, 30))
    assert t_quantile(0.7, 10) == 0.0, "a level above a half is capped at the median"
    assert t_quantile(0.05, 0) == math.inf and t_quantile(0.0, 10) == math.inf
    assert t_quantile(0.01, 5) > t_quantile(0.01, 50) > t_quantile(0.05, 50)


@pytest.mark.parametrize("detrend", [True, False])
def test_level_test_bounds_are_one_sided_t_bounds_in_order(detrend: bool) -> None:
    """lower: mean - t(alpha, df) se (the hold side); upper: mean + t(beta, df) se (the pass
    side); the 95% estimate interval for people lies between them when alpha and beta are
    below 2.5%; df is blocks - 2 after a trend, blocks - 1 without."""
    x = np.random.default_rng(8).normal(0.05, 0.02, 32)
    bt = level_test(x, 0.001, 0.01, detrend=detrend)
    lr = long_run(x, detrend)
    se = lr.sd / math.sqrt(32)
    assert bt.df == (30 if detrend else 31) == lr.df
    assert (bt.mean, bt.sd, bt.phi) == (lr.mean, lr.sd, lr.phi)
    assert bt.se == pytest.approx(se)
    assert bt.lower == pytest.approx(lr.mean - t_quantile(0.001, bt.df) * se)
    assert bt.upper == pytest.approx(lr.mean + t_quantile(0.01, bt.df) * se)
    assert bt.lower < bt.estimate[0] < bt.mean < bt.estimate[1] < bt.upper
    assert bt.finite
    # A larger level spends more: its bound moves toward the mean.
    assert level_test(x, 0.01, 0.01, detrend=detrend).lower > bt.lower
    assert level_test(x, 0.001, 0.1, detrend=detrend).upper < bt.upper


def test_too_few_blocks_decide_nothing() -> None:
    bt = level_test(np.array([0.1, 0.2, 0.3]), 0.05, 0.05)
    assert bt.blocks == 3 < MIN_TEST_BLOCKS and not bt.finite
    assert bt.lower == -math.inf and bt.upper == math.inf
    assert bt.mean == pytest.approx(0.2)
    assert detectable_shift(MIN_TEST_BLOCKS - 1, 0.1, 0.05) == math.inf
    assert detectable_shift(10, math.nan, 0.05) == math.inf


@pytest.mark.parametrize(
    "looks",
    [
        tuple(range(500, 4_001, 500)),
        (500, 1_000, 1_500, 1_777, 2_000, 2_500, 3_000),
        (1_000,),
        (32, 64, 5_000),
    ],
)
def test_spending_over_the_looks_sums_to_alpha_and_beta(looks: tuple[int, ...]) -> None:
    """Over every planned look the hold side spends alpha x ((n_k / L)^2 - (n_(k-1) / L)^2)
    and the pass side beta x (n_k - n_(k-1)) / L: they sum to alpha and beta exactly (the
    union bound over the looks is at most alpha)."""
    alpha, beta = 0.003, 0.05
    levels = [look_levels(n, looks, alpha, beta) for n in looks]
    assert [n for n, _, _ in levels] == list(looks)
    assert math.fsum(a for _, a, _ in levels) == pytest.approx(alpha, rel=1e-12)
    assert math.fsum(b for _, _, b in levels) == pytest.approx(beta, rel=1e-12)
    limit = looks[-1]
    prev = 0
    for n, a, b in levels:
        assert a == pytest.approx(alpha * ((n / limit) ** SPEND_POWER - (prev / limit) ** 2))
        assert b == pytest.approx(beta * (n - prev) / limit), "beta is spent linearly"
        prev = n


def test_equal_looks_spend_little_early_and_most_at_the_end() -> None:
    looks = tuple(range(500, 4_001, 500))
    alphas = [look_levels(n, looks, 0.01, 0.05)[1] for n in looks]
    assert all(a < b for a, b in itertools.pairwise(alphas))
    assert alphas[0] == pytest.approx(0.01 / 64)
    assert alphas[-1] == pytest.approx(0.01 * 15 / 64)


def test_a_size_between_looks_is_judged_at_the_last_planned_look() -> None:
    looks = (500, 1_000, 1_500)
    assert look_levels(1_234, looks, 0.01, 0.05) == look_levels(1_000, looks, 0.01, 0.05)
    assert look_levels(1_234, looks, 0.01, 0.05)[0] == 1_000
    assert look_levels(9_999, looks, 0.01, 0.05) == look_levels(1_500, looks, 0.01, 0.05)
    assert look_levels(499, looks, 0.01, 0.05) == (0, 0.0, 0.0), "before the first look"


# --- Planning figures ------------------------------------------------------------------------


def test_spread_factor() -> None:
    """The sd of a block statistic per unit of log-ratio noise and per sqrt(requests): 1.06
    for the trimmed mean; sqrt(q (1 - q)) / pdf(z_q) for a quantile; the tail as a p97.5."""
    assert spread_factor(0.5) == 1.06
    z = stats.norm.ppf(0.9)
    assert spread_factor(0.9) == pytest.approx(math.sqrt(0.09) / stats.norm.pdf(z))
    assert spread_factor(None) == pytest.approx(spread_factor(0.975))


def test_detectable_and_planned_shift() -> None:
    """What a final look detects with 80% power: (t(alpha, df) + z_0.8) sd / sqrt(blocks); the
    plan's figure assumes a pair's log-ratio sd `noise`, the block's spread factor, the
    average widening the credited lag-1 correlation gives independent blocks (about
    1 + 0.8 / sqrt(blocks) in variance), and the alpha the check spends at its last look."""
    assert detectable_shift(32, 0.05, 0.01) == pytest.approx(
        (t_quantile(0.01, 30) + POWER_Z) * 0.05 / math.sqrt(32)
    )
    lay = Layout.build(4_000, times=np.arange(4_000) / 20.0)
    sd = 0.3 * 1.06 / math.sqrt(125) * math.sqrt(1.0 + 0.8 / math.sqrt(32))
    one = planned_shift(lay, [4_000], 0.5, 0.3, 0.002)
    assert one == pytest.approx(detectable_shift(32, sd, 0.002))
    looks = tuple(range(500, 4_001, 500))
    spent = look_levels(4_000, looks, 0.002, 0.0)[1]
    assert planned_shift(lay, looks, 0.5, 0.3, 0.002) == pytest.approx(
        detectable_shift(32, sd, spent)
    )
    assert planned_shift(lay, looks, 0.5, 0.3, 0.002) > one, "looks spend some alpha early"


def test_size_to_detect_is_the_smallest_size_that_does() -> None:
    n = size_to_detect(0.10, 0.5, 0.3, 0.00375, 0.05)
    assert n is not None and n > MIN_BLOCK_REQUESTS * MIN_BLOCKS

    def shift_at(size: int) -> float:
        return planned_shift(Layout.build(size), [size], 0.5, 0.3, 0.00375)

    target = math.log1p(0.10) - math.log1p(0.05)
    assert shift_at(n) <= target < shift_at(n - 1)
    assert size_to_detect(0.05, 0.5, 0.3, 0.00375, 0.05) is None  # at the tolerance: never
    assert size_to_detect(0.04, 0.5, 0.3, 0.00375, 0.05) is None  # below it: never
    # In time: blocks of at least MIN_BLOCK_S, so at 100 requests/s a block holds 200 and the
    # size found is judged with those blocks.
    timed = size_to_detect(0.10, 0.5, 0.3, 0.00375, 0.05, times_per_request=0.01)
    assert timed is not None
    lay = Layout.build(timed, times=np.arange(timed) * 0.01)
    assert planned_shift(lay, [timed], 0.5, 0.3, 0.00375) <= target


# --- The error rate under dependence ----------------------------------------------------------

N = 1_024  # 32 blocks of 32 requests: the block statistics vectorize
LOOKS = (256, 512, 768, 1_024)


def engine(
    rng: np.random.Generator, common: np.ndarray, batch_sd: float, batch: int, own_sd: float
) -> np.ndarray:
    """One engine's latencies: the part both engines share (mirrored prompt and load), this
    engine's batch effect (requests of a batch share it; batch boundaries at a random phase)
    and each request's own noise."""
    n = common.size
    which = (np.arange(n) + rng.integers(batch)) // batch
    return np.asarray(
        np.exp(
            4.0
            + common
            + rng.normal(0.0, batch_sd, which[-1] + 1)[which]
            + own_sd * rng.normal(size=n)
        )
    )


def block_stat(ref: np.ndarray, cand: np.ndarray, q: float, width: int = 32) -> np.ndarray:
    """block_trimmed_means / block_quantiles over blocks of `width` (32: the layout of N
    requests; latency.py's quantile checks use two of them, 64), vectorized
    (test_vectorized_block_statistics_match shows they are the same)."""
    m = ref.size // width
    r, c = ref[: m * width].reshape(m, width), cand[: m * width].reshape(m, width)
    if q == 0.5:
        return np.asarray(stats.trim_mean(np.log(c) - np.log(r), 0.2, axis=1))
    return np.asarray(np.log(np.quantile(c, q, axis=1)) - np.log(np.quantile(r, q, axis=1)))


def test_vectorized_block_statistics_match() -> None:
    rng = np.random.default_rng(9)
    ref, cand = rng.lognormal(4.0, 0.3, N), rng.lognormal(4.0, 0.3, N)
    lay = Layout.build(N)
    assert lay.edges == tuple(range(0, N + 1, 32))
    block = lay.index(np.arange(N))
    assert np.allclose(block_stat(ref, cand, 0.5), block_trimmed_means(ref, cand, block, 32))
    assert np.allclose(block_stat(ref, cand, 0.9), block_quantiles(ref, cand, block, 32, 0.9))


def fails_at_some_look(
    ref: np.ndarray, cand: np.ndarray, q: float | None, alpha: float, robust: bool
) -> bool:
    """The check's hold side at each planned look, alpha spent by look_levels."""
    for n in LOOKS:
        _, a, b = look_levels(n, LOOKS, alpha, 0.05)
        if q is None:
            m = n // 32
            block = np.arange(n) // 32
            ts = tail_scale(ref[:n], cand[:n], block, m, a, b)
            if ts.levels and ts.lower > 0.0:
                return True
        elif level_test(block_stat(ref[:n], cand[:n], q), a, b, robust=robust).lower > 0.0:
            return True
    return False


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    common_sd=st.floats(0.0, 0.4),
    batch_sd=st.floats(0.0, 0.25),
    batch=st.sampled_from([1, 8, 16, 32]),
    own_sd=st.floats(0.02, 0.3),
    q=st.sampled_from([0.5, 0.9, None]),
    robust=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_aa_false_fails_stay_within_alpha_when_requests_share_batches(
    common_sd: float,
    batch_sd: float,
    batch: int,
    own_sd: float,
    q: float | None,
    robust: bool,
    seed: int,
) -> None:
    """Identical engines whose requests share batches of up to 32 (up to two thirds of the
    variance in the batch part) and a load both share: over the planned looks, the share of
    gates whose one-sided test ever put the lower bound above a zero shift stays within its
    alpha (the p50 and p90 statistics with the classical or the robust long-run sd; the tail
    check's levels against a tail scale of 1). The p90 and the tail with batches half a block
    or longer are test_p90_false_fails_when_a_block_is_one_batch's and
    test_tail_false_fails_when_requests_share_batches' (suspected bugs)."""
    assume(q == 0.5 or batch <= 8)
    alpha, gates = 0.05, 250
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(gates):
        common = rng.normal(0.0, common_sd, N)
        ref = engine(rng, common, batch_sd, batch, own_sd)
        cand = engine(rng, common, batch_sd, batch, own_sd)
        fails += fails_at_some_look(ref, cand, q, alpha, robust)
    assert fails <= binom.ppf(0.999, gates, alpha), fails


def test_p90_false_fails_when_a_block_is_one_batch() -> None:
    """Identical engines, requests in batches of 32 (a block's length) whose shared effect
    dominates each request's own noise: the p90 check's false-fail rate over the looks stays
    within alpha. On blocks of 32 it failed 103 of 1,000 (a block of one or two batches makes
    a quantile far from normal); the quantile checks take two blocks (latency.py), 64
    requests, where it is 62 of 1,000."""
    alpha, gates = 0.05, 1_000
    rng = np.random.default_rng(5)
    fails = 0
    for _ in range(gates):
        common = np.zeros(N)
        ref = engine(rng, common, 0.25, 32, 0.03)
        cand = engine(rng, common, 0.25, 32, 0.03)
        for n in LOOKS:
            _, a, b = look_levels(n, LOOKS, alpha, 0.05)
            if level_test(block_stat(ref[:n], cand[:n], 0.9, width=64), a, b).lower > 0.0:
                fails += 1
                break
    assert fails <= binom.ppf(0.999, gates, alpha), fails


def test_tail_false_fails_when_requests_share_batches() -> None:
    """Identical engines, requests in batches of 32 whose shared effect dominates: the tail
    check's false-fail rate over the looks stays within alpha, as it does for independent
    requests (test_aa_false_fails_stay_within_alpha_when_requests_share_batches). It failed 75
    of 300 before a level was tested only where both engines' tail spreads over half the
    jackknife groups (tails.py)."""
    alpha, gates = 0.05, 300
    rng = np.random.default_rng(0)
    fails = 0
    for _ in range(gates):
        common = np.zeros(N)
        ref = engine(rng, common, 0.25, 32, 0.03)
        cand = engine(rng, common, 0.25, 32, 0.03)
        fails += fails_at_some_look(ref, cand, None, alpha, False)
    assert fails <= binom.ppf(0.999, gates, alpha), fails


def test_the_blocks_are_what_keeps_the_error_rate_under_batches() -> None:
    """The same heavy-batch A/A tested on single requests (every request its own block: the
    AR(1) factor alone cannot carry a correlation that lasts a whole batch of 32) fails far
    more often than alpha; on the layout's blocks of 32 it stays within alpha."""
    alpha, gates = 0.05, 300
    bound = binom.ppf(0.999, gates, alpha)
    naive = blocked = 0
    rng = np.random.default_rng(11)
    for _ in range(gates):
        common = np.zeros(N)
        x = np.log(engine(rng, common, 0.25, 32, 0.1)) - np.log(engine(rng, common, 0.25, 32, 0.1))
        ref, cand = np.ones(N), np.exp(x)
        blocked += fails_at_some_look(ref, cand, 0.5, alpha, False)
        for n in LOOKS:
            _, a, b = look_levels(n, LOOKS, alpha, 0.05)
            if level_test(x[:n], a, b).lower > 0.0:
                naive += 1
                break
    assert naive > 1.5 * bound, naive  # measured 81 of 300 against a bound of 28
    assert blocked <= bound, blocked


def test_a_latency_read_as_zero_weighs_no_more_than_the_floor() -> None:
    """A stalled stream's tokens arrive in one read and its inter-token latency reads 0 (seen
    on real vLLM on a starved host); its log ratio is bounded by LATENCY_FLOOR_MS, not by a
    picosecond (judge v3 first: a window's interval of 6e-10x to 5e13x)."""
    from gate.analysis.paired import LATENCY_FLOOR_MS, log_ratio

    x = log_ratio(np.array([100.0, 100.0, 0.0]), np.array([0.0, 100.0, 0.0]))
    assert x[0] == pytest.approx(math.log(LATENCY_FLOOR_MS / 100.0))
    assert x[1] == 0.0 and x[2] == 0.0
    assert abs(x[0]) < 7.0  # 1,000x at most: a picosecond floor read 25
