"""The tail check: its statistic, its e-values' exactness and monotonicity, coverage at every
look (i.i.d., under a drift both arms feel, and under the simulator's batch effects), power
against a tail-only regression, and its place in the judge.

Measured with this implementation (the null's boundary: the candidate is the reference scaled
by exactly 1 + tolerance, 1.07; alpha 0.05; looks every 500 pairs up to 20,000; 300 gates
each): false fails 0.7% i.i.d., 2.0% with the simulator's batches (8 requests sharing a
log-sd 0.10 factor) and drift (5%), 27% with much stronger batches (32 requests, log-sd 0.20,
a third of the variance). On their own null boundaries under those stronger batches (200
gates), the quantile checks' p50 sequences fail 15% and p99 1.5% of the time at the same
alpha: the tail test, like the p50 one, does not survive within-arm dependence that strong.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from gate.analysis.calibration import AA, Case, SimConfig, _gate
from gate.analysis.calibration import _arm as _sim_arm
from gate.analysis.judge import judge
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.sequential import SequentialJudge
from gate.analysis.tail import (
    FIRST_PAIRS,
    TailTest,
    _epoch_bounds,
    _psi,
    _Sorted,
    tail_checks,
    tail_test,
    tail_windows,
)
from gate.analysis.types import ArmSamples, EngineFacts, ScenarioSamples

ENGINES = (EngineFacts("reference", 60.0), EngineFacts("candidate", 61.0))
TOL = Policy().tail.tolerance


def _test(ref: np.ndarray, cand: np.ndarray, alpha: float, t_opt: int) -> TailTest | None:
    return tail_test(ref, cand, tolerance=TOL, alpha=alpha, t_opt=t_opt, start=0.95, top=0.995)


def _fails(ref: np.ndarray, cand: np.ndarray, alpha: float, t_opt: int) -> bool:
    res = _test(ref, cand, alpha, t_opt)
    return res is not None and res.fail


def _arm(ttft: np.ndarray, itl: np.ndarray | None = None) -> ArmSamples:
    return ArmSamples(
        requests=int(ttft.size), ttft_ms=ttft, itl_ms=ttft / 10.0 if itl is None else itl
    )


def _tail_only(x: np.ndarray, factor: float, sigma: float) -> np.ndarray:
    p95 = 100.0 * math.exp(1.6448536269514722 * sigma)
    return np.where(x > p95, x * factor, x)


def test_w_is_the_window_average_of_survival_differences() -> None:
    """clip(log c - s) - clip(log r) is the integral over [a, b] of 1{c > e^s T} - 1{r > T}
    in dT / T: the statistic compares the two survival functions across the window."""
    rng = np.random.default_rng(3)
    a, b, s = 120.0, 180.0, math.log(1.07)
    grid = np.exp(np.linspace(math.log(a), math.log(b), 200_001))
    dlog = np.diff(np.log(grid))
    mid = np.sqrt(grid[1:] * grid[:-1])
    for c, r in rng.uniform(80.0, 260.0, (20, 2)):
        direct = np.clip(math.log(c) - s, math.log(a), math.log(b)) - np.clip(
            math.log(r), math.log(a), math.log(b)
        )
        integral = float((((c > math.exp(s) * mid) * 1.0 - (r > mid)) * dlog).sum())
        assert direct == pytest.approx(integral, abs=1e-5)


def _state(seed: int, n: int, factor: float) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    lr = rng.normal(4.6, 0.3, n)
    lc = rng.normal(4.6, 0.3, n) + math.log(factor)
    win = tail_windows(lr, n, 0.95, 0.995)
    lr, lc = lr[FIRST_PAIRS:], lc[FIRST_PAIRS:]
    cr = np.clip(lr, win.log_a, win.log_b)
    lam = np.minimum(0.5, rng.uniform(0.0, 0.6, lr.size))
    return lr, lc, cr, lam, win.log_a, win.log_b, win.inv_width


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(FIRST_PAIRS + 1, 5000),
    factor=st.floats(0.8, 1.3),
    s=st.floats(-0.3, 0.4),
)
def test_indexed_sums_equal_direct_sums(seed: int, n: int, factor: float, s: float) -> None:
    lr, lc, cr, lam, log_a, log_b, inv = _state(seed, n, factor)
    psi = _psi(lam)
    win = tail_windows(np.concatenate([np.zeros(FIRST_PAIRS), lr]), n, 0.95, 0.995)
    win = type(win)(win.first, log_a, log_b, inv)
    w = (np.clip(lc - s, log_a, log_b) - cr) * inv
    want = (float(lam @ w), float(psi @ (w * w)), float(w.sum()))
    got = _Sorted.build(lc, cr, win, lam, psi, s - 0.5).sums(s)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), factor=st.floats(0.8, 1.3))
def test_e_values_fall_as_s_grows(seed: int, factor: float) -> None:
    """Bets of at most 1/2 keep each factor monotone, so the rejected s form half-lines."""
    _, lc, cr, lam, log_a, log_b, inv = _state(seed, 3000, factor)
    psi = _psi(lam)
    prev_fail, prev_pass = math.inf, -math.inf
    for s in np.linspace(-0.5, 0.6, 45):
        w = (np.clip(lc - s, log_a, log_b) - cr) * inv
        e_fail = float(lam @ w - psi @ (w * w))
        e_pass = float(-(lam @ w) - psi @ (w * w))
        assert e_fail <= prev_fail + 1e-9
        assert e_pass >= prev_pass - 1e-9
        prev_fail, prev_pass = e_fail, e_pass


def test_epochs_cover_every_pair_once() -> None:
    for pairs in (FIRST_PAIRS + 1, 1000, 20_000):
        bounds = _epoch_bounds(pairs)
        assert bounds[0][0] == 0 and bounds[-1][1] == pairs - FIRST_PAIRS
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        # Each epoch is at most 25% of the pairs before it: windows come from >= 80% of them.
        assert all((hi - lo) <= math.ceil(0.25 * (lo + FIRST_PAIRS)) for lo, hi in bounds)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    sigma=st.floats(0.1, 0.8),
    ratio=st.floats(0.9, 1.2),
    drift=st.floats(0.0, 0.3),
    alpha=st.sampled_from([0.05, 0.1]),
    seed=st.integers(0, 2**32 - 1),
)
def test_coverage_at_every_look(
    sigma: float, ratio: float, drift: float, alpha: float, seed: int
) -> None:
    """The interval holds the true tail ratio at every look at once in >= 1 - 2 alpha of the
    runs, when both arms feel the same load swing; on the null's boundary the check fails in
    at most alpha of them."""
    runs, n = 100, 2000
    looks = range(400, n + 1, 400)
    rng = np.random.default_rng(seed)
    misses = fails = 0
    for _ in range(runs):
        swing = 1.0 + drift * np.sin(np.arange(n) / rng.uniform(50.0, 2000.0) + rng.uniform(0, 6))
        ref = rng.lognormal(math.log(100.0), sigma, n) * swing
        cand = rng.lognormal(math.log(100.0), sigma, n) * swing * ratio
        edge = cand / ratio * (1.0 + TOL)  # the same draws on the null's boundary
        missed = failed = False
        for t in looks:
            res = _test(ref[:t], cand[:t], alpha, n)
            assert res is not None
            missed |= not res.lower <= ratio <= res.upper
            failed |= _fails(ref[:t], edge[:t], alpha, n)
        misses += missed
        fails += failed
    assert misses <= binom.ppf(0.999, runs, 2 * alpha)
    assert fails <= binom.ppf(0.999, runs, alpha)


def test_false_fails_on_the_null_boundary_with_batches_and_drift() -> None:
    """The simulator's engines (batches of 8 sharing a log-sd 0.10 factor, a 5% load swing
    both arms feel): a candidate exactly 1 + tolerance slower fails at most alpha of the time
    (here looks every 1,000 requests up to 5,000; over 20,000 with looks every 500 it failed
    2.0% of the time at alpha 0.05)."""
    config, n = SimConfig(), 5000
    runs, alpha = 150, 0.1
    fails = 0
    for r in range(runs):
        rng = np.random.default_rng(r)
        sent = np.cumsum(rng.exponential(1.0 / config.rate, n))
        phase = rng.uniform(0.0, 2.0 * math.pi)
        drift = 1.0 + config.drift * np.sin(2.0 * math.pi * sent / config.drift_period_s + phase)
        ref = _sim_arm(rng, n, config, drift, None).ttft
        cand = _sim_arm(rng, n, config, drift, Case("edge", ttft=1.0 + TOL)).ttft
        ref, cand = ref[~np.isnan(ref)], cand[~np.isnan(cand)]
        fails += any(_fails(ref[:t], cand[:t], alpha, n) for t in range(1000, n + 1, 1000))
    assert fails <= binom.ppf(0.999, runs, alpha)


def _first_look(case: Case, seed: int, want: str, limit: int) -> int | None:
    """The first look (every 500 up to limit) at which the TTFT tail check reads `want`."""
    config = SimConfig(limit=limit)
    gate = _gate(case, config, 5, np.random.default_rng(seed))
    plan = Plan.build(Policy(), {"steady": 20_000})
    ref = gate.ref.ttft[~np.isnan(gate.ref.ttft)]
    cand = gate.cand.ttft[~np.isnan(gate.cand.ttft)]
    for t in range(500, limit + 1, 500):
        s = ScenarioSamples("steady", _arm(ref[:t]), _arm(cand[:t]))
        checks = tail_checks([s], plan.policy, [], plan=plan, final=False)
        ttft = next(c for c in checks if c.metric == "ttft")
        if ttft.decision == want:
            return t
        assert ttft.decision == "inconclusive", ttft.message
    return None


def test_holds_a_tail_only_regression_of_15_percent_within_10k() -> None:
    """The calibration's tail-only x1.15 (above the reference's p95): the default plan of
    20,000 requests holds it within 10,000 (calibration: 95% of 200 gates, median 6,000)."""
    found = [_first_look(Case("tail", tail=1.15), seed, "fail", 10_000) for seed in range(10)]
    assert sum(t is not None for t in found) >= 9, found


def test_passes_identical_engines() -> None:
    found = [_first_look(AA, seed, "pass", 10_000) for seed in range(10)]
    assert sum(t is not None for t in found) >= 9, found


def _lognormal(seed: int, n: int, sigma: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(math.log(100.0), sigma, n)


def test_the_judge_reports_the_tail_check_like_the_others() -> None:
    ref = _lognormal(1, 6000)
    cand = _tail_only(_lognormal(2, 6000), 1.3, 0.3)
    itl_r, itl_c = _lognormal(3, 6000, 0.1) / 5.0, _lognormal(4, 6000, 0.1) / 5.0
    verdict = judge(
        [ScenarioSamples("steady", _arm(ref, itl_r), _arm(cand, itl_c))], ENGINES, Policy()
    )
    check = next(c for c in verdict.checks if c.id == "steady.ttft.tail")
    assert check in verdict.reasons
    assert (check.group, check.metric, check.quantile) == ("latency", "ttft", None)
    assert check.decision == "fail"
    assert check.threshold == pytest.approx(1.07)
    assert check.alpha == pytest.approx(0.05 * 0.1 / 2)
    assert check.samples == (6000, 6000)
    assert check.ratio == pytest.approx(1.3, rel=0.05)
    assert check.interval is not None and 1.07 < check.interval[0] < 1.3 < check.interval[1]
    assert check.reference is not None and check.candidate is not None
    assert check.candidate / check.reference == pytest.approx(1.3, rel=0.05)
    assert check.message.startswith("TTFT tail above p95 in steady is 1.29x the reference")
    assert "above the 1.07x threshold" in check.message
    itl = next(c for c in verdict.checks if c.id == "steady.itl.tail")
    assert itl.decision == "pass" and "within tolerance" in itl.message


def test_an_undecided_tail_is_a_note_not_a_hold() -> None:
    ref, cand = _lognormal(1, 600, 0.1), _lognormal(2, 600, 0.1)
    verdict = judge([ScenarioSamples("steady", _arm(ref), _arm(cand))], ENGINES, Policy())
    assert verdict.decision == "continue", [c.message for c in verdict.reasons]
    assert not any(c.id.endswith(".tail") for c in verdict.checks)
    assert any("TTFT tail above p95 in steady not established" in n for n in verdict.notes)
    few = judge(
        [ScenarioSamples("steady", _arm(_lognormal(1, 150)), _arm(_lognormal(2, 150)))],
        ENGINES,
        Policy(),
    )
    assert any("tail test starts after 200" in n for n in few.notes)


def test_no_tail_budget_turns_the_check_off() -> None:
    policy = Policy(alpha_split={"latency": 0.4, "errors": 0.2, "correctness": 0.4})
    ref, cand = _lognormal(1, 3000), _tail_only(_lognormal(2, 3000), 1.5, 0.3)
    verdict = judge([ScenarioSamples("steady", _arm(ref), _arm(cand))], ENGINES, policy)
    assert not any(c.id.endswith(".tail") for c in verdict.checks)
    assert "Tail checks off: alpha_split gives tail no budget." in verdict.notes
    assert Plan.build(policy, {"steady": 1000}).tail_alpha == 0.0


def test_plan_spends_the_tail_budget_per_scenario_and_metric() -> None:
    plan = Plan.build(Policy(), {"a": 1000, "b": 2000})
    assert plan.tail_alpha == pytest.approx(0.05 * 0.1 / 4)
    assert any("Tail budget 0.005 planned over 4 tail checks" in n for n in plan.notes)


def test_the_last_look_and_the_final_judge_agree() -> None:
    ref = _lognormal(1, 4000)
    cand = _tail_only(_lognormal(2, 4000), 1.3, 0.3)
    plan = Plan.build(Policy(), {"steady": 4000})
    look = SequentialJudge(plan).look("steady", _arm(ref), _arm(cand))
    verdict = judge(
        [ScenarioSamples("steady", _arm(ref), _arm(cand))],
        ENGINES,
        Policy(),
        plan=plan,
        bootstrap=False,
    )
    mine = {c.id: c for c in look.checks if c.id.endswith(".tail")}
    final = {c.id: c for c in verdict.checks if c.id.endswith(".tail")}
    assert mine == final and mine["steady.ttft.tail"].decision == "fail"


def test_edges_and_bad_arguments() -> None:
    x = _lognormal(1, FIRST_PAIRS)
    assert _test(x, x, 0.05, 1000) is None
    constant = np.full(1000, 50.0)  # a window of zero width judges nothing
    res = _test(constant, constant, 0.05, 1000)
    assert res is not None and not res.fail and not res.passed
    with pytest.raises(ValueError, match="alpha"):
        _test(x, x, 0.0, 1000)
    with pytest.raises(ValueError, match="start < top"):
        tail_test(x, x, tolerance=0.07, alpha=0.05, t_opt=1000, start=0.99, top=0.95)


def test_fast_at_a_million_pairs() -> None:
    ref = _lognormal(1, 1_000_000)
    cand = _lognormal(2, 1_000_000) * 1.02
    _test(ref[:5000], cand[:5000], 0.0025, 5000)
    start = time.perf_counter()
    res = _test(ref, cand, 0.0025, 1_000_000)
    assert time.perf_counter() - start < 1.5
    assert res is not None and res.passed
    assert res.lower < 1.02 < res.upper and res.upper - res.lower < 0.02
