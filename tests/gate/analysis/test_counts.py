"""One-sided Lindon-Malek count test: validity, power, monotonicity, one-sidedness.

Measured (k = 10, alpha 0.05, 1000 seeded runs each): A/A false rejections 1.0% after 30
events, 1.9% after 200, 4.8% after 2000; a 5x candidate error rate (share 5/6) is rejected in
92% of runs after 30 events and in all runs after 60; a 2x rate in 55% after 60 events and
99% after 200; a candidate with fewer errors (share 0.2) never.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from scipy.special import betaln
from scipy.stats import beta as beta_dist
from scipy.stats import binom

from gate.analysis.counts import (
    kind_mixture_pvalues,
    log_bayes_factors,
    sequential_count_pvalue,
    sequential_count_pvalues,
)

label_lists = st.lists(st.integers(0, 1), min_size=1, max_size=300)


def _rejection_rate(share: float, events: int, runs: int, seed: int, rho: float = 0.5) -> float:
    rng = np.random.default_rng(seed)
    rejected = 0
    for _ in range(runs):
        labels = (rng.random(events) < share).astype(np.int64)
        rejected += sequential_count_pvalue(labels, rho=rho) <= 0.05
    return rejected / runs


@pytest.mark.parametrize("rho", [0.5, 0.3])
def test_equal_error_rates_rarely_reject(rho: float) -> None:
    runs = 400
    rate = _rejection_rate(rho, 400, runs, seed=11, rho=rho)
    assert rate <= binom.ppf(0.999, runs, 0.05) / runs


def test_five_times_the_errors_is_rejected_in_most_runs() -> None:
    assert _rejection_rate(5 / 6, 60, 200, seed=12) >= 0.9


def test_fewer_candidate_errors_never_reject() -> None:
    assert _rejection_rate(0.2, 500, 200, seed=13) == 0.0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(labels=label_lists, rho=st.floats(0.05, 0.95), k=st.floats(0.5, 200.0))
def test_pvalues_are_non_increasing_and_in_unit_interval(
    labels: list[int], rho: float, k: float
) -> None:
    path = sequential_count_pvalues(np.array(labels), rho=rho, k=k)
    assert path.shape == (len(labels),)
    assert np.all((path > 0.0) & (path <= 1.0))
    assert np.all(np.diff(path) <= 0.0)
    assert sequential_count_pvalue(np.array(labels), rho=rho, k=k) == path[-1]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(labels=label_lists, rho=st.floats(0.05, 0.95), k=st.floats(0.5, 200.0))
def test_one_sided_no_evidence_when_candidate_share_is_at_most_rho(
    labels: list[int], rho: float, k: float
) -> None:
    arr = np.array(labels)
    log_bf = log_bayes_factors(arr, rho=rho, k=k)
    share = np.cumsum(arr) / np.arange(1, arr.size + 1)
    assert np.all(log_bf[share <= rho] <= 1e-9)
    if np.all(share <= rho):
        assert sequential_count_pvalue(arr, rho=rho, k=k) == 1.0


@pytest.mark.parametrize(("x_c", "x_r", "rho", "k"), [(5, 1, 0.5, 10.0), (3, 9, 0.3, 2.0)])
def test_bayes_factor_matches_numerical_integration(
    x_c: int, x_r: int, rho: float, k: float
) -> None:
    a_c, a_r = k * rho, k * (1.0 - rho)

    def integrand(theta: float) -> float:
        lr = (theta / rho) ** x_c * ((1.0 - theta) / (1.0 - rho)) ** x_r
        return float(lr * beta_dist.pdf(theta, a_c, a_r))

    prior_tail = float(beta_dist.sf(rho, a_c, a_r))
    expected = quad(integrand, rho, 1.0)[0] / prior_tail
    labels = np.array([1] * x_c + [0] * x_r)
    assert math.exp(log_bayes_factors(labels, rho, k)[-1]) == pytest.approx(expected, rel=1e-7)
    # And it reduces to the paper's closed form when the truncation is undone.
    full = betaln(a_c + x_c, a_r + x_r) - betaln(a_c, a_r) - x_c * math.log(rho)
    full -= x_r * math.log1p(-rho)
    assert full == pytest.approx(math.log(quad(integrand, 0.0, 1.0)[0]), rel=1e-7)


@pytest.mark.parametrize("n", [1, 10, 60])
def test_bayes_factor_has_mean_one_under_the_null(n: int) -> None:
    """The truncated mixture is still a mixture of likelihood ratios: exactly mean 1 at rho."""
    rho, k = 0.4, 10.0
    total = 0.0
    for x_c in range(n + 1):
        labels = np.array([1] * x_c + [0] * (n - x_c))
        total += binom.pmf(x_c, n, rho) * math.exp(log_bayes_factors(labels, rho, k)[-1])
    assert total == pytest.approx(1.0, rel=1e-9)


def test_edge_cases() -> None:
    assert sequential_count_pvalue(np.zeros(0, dtype=np.int64)) == 1.0
    with pytest.raises(ValueError, match="labels"):
        sequential_count_pvalue(np.array([0, 2]))
    with pytest.raises(ValueError, match="rho"):
        sequential_count_pvalue(np.array([1]), rho=1.0)
    # A long run of candidate-only errors neither overflows nor turns into NaN.
    assert 0.0 <= sequential_count_pvalue(np.ones(5000, dtype=np.int64)) < 1e-100


KINDS = ["http_5xx", "timeout", "stream_error"]


def _kinds(rng: np.random.Generator, n: int) -> list[str]:
    return [KINDS[i] for i in rng.choice(3, size=n, p=[0.6, 0.3, 0.1])]


def test_kind_mixture_is_valid_under_the_null() -> None:
    """Every kind split 50/50: the mixture (pooled half, per-kind half) rejects within alpha."""
    rng = np.random.default_rng(21)
    runs, events = 300, 300
    rejected = 0
    for _ in range(runs):
        labels = (rng.random(events) < 0.5).astype(np.int64)
        result = kind_mixture_pvalues(labels, _kinds(rng, events), KINDS)
        rejected += result.pvalue <= 0.05
    assert rejected <= binom.ppf(0.999, runs, 0.05)


def test_a_new_kind_hidden_among_common_ones_is_caught() -> None:
    """40 candidate-only timeouts among 400 evenly split 5xx: invisible pooled, caught by kind."""
    rng = np.random.default_rng(22)
    labels = np.concatenate([(rng.random(400) < 0.5).astype(np.int64), np.ones(40, np.int64)])
    kinds = ["http_5xx"] * 400 + ["timeout"] * 40
    order = rng.permutation(labels.size)
    labels, kinds = labels[order], [kinds[i] for i in order]
    result = kind_mixture_pvalues(labels, kinds, KINDS)
    assert sequential_count_pvalue(labels) > 0.05
    assert result.pvalue < 0.01
    assert min(result.kind_pvalues, key=lambda k: result.kind_pvalues[k]) == "timeout"
    assert result.kind_pvalues["timeout"] >= result.pvalue


def test_mixture_without_kinds_share_is_the_pooled_test() -> None:
    labels = np.array([1, 1, 0, 1, 1, 1, 0, 1, 1, 1])
    kinds = ["timeout"] * 10
    pooled = kind_mixture_pvalues(labels, kinds, KINDS, kind_share=0.0).pvalue
    assert pooled == pytest.approx(sequential_count_pvalue(labels))
    assert kind_mixture_pvalues(np.zeros(0, np.int64), [], KINDS).pvalue == 1.0
    # An unlisted kind goes to the shared "other" component.
    other = kind_mixture_pvalues(labels, ["oom"] * 10, KINDS)
    assert set(other.kind_pvalues) == {"other"}
    with pytest.raises(ValueError, match="kinds"):
        kind_mixture_pvalues(labels, kinds[:3], KINDS)


def test_final_counts_only_ignore_the_order() -> None:
    labels = np.array([1] * 12 + [0] * 3)
    a = kind_mixture_pvalues(labels, ["http_5xx"] * 15, KINDS, running=False)
    b = kind_mixture_pvalues(labels[::-1].copy(), ["http_5xx"] * 15, KINDS, running=False)
    assert a.pvalue == pytest.approx(b.pvalue)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    burst=st.sampled_from([1, 4, 15, 40]),
    rate=st.floats(0.002, 0.01),
    n=st.sampled_from([800, 2_000, 5_000]),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_block_ceiling_test_keeps_its_alpha_under_bursts(
    burst: int, rate: float, n: int, seed: int
) -> None:
    """An engine at or under the 1% ceiling whose errors come in bursts of up to 40
    consecutive requests: the share of gates whose running capital ever reached 1/alpha stays
    within alpha (the count-based e-process, which assumes independent errors, does not)."""
    from gate.analysis.counts import block_fractions, log_ceiling_capital

    rng = np.random.default_rng(seed)
    alpha, gates = 0.05, 300
    held = 0
    for _ in range(gates):
        starts = rng.random(n) < rate / burst
        failed = np.convolve(starts.astype(np.int64), np.ones(burst, np.int64))[:n] > 0
        f = block_fractions(np.nonzero(failed)[0], 0, n, 32)
        held += log_ceiling_capital(f, 0.01) >= math.log(1 / alpha)
    assert held <= binom.ppf(0.999, gates, alpha), held


def test_the_block_ceiling_test_finds_a_doubled_rate() -> None:
    from gate.analysis.counts import block_fractions, log_ceiling_capital

    rng = np.random.default_rng(5)
    found = sum(
        log_ceiling_capital(
            block_fractions(np.nonzero(rng.random(5_000) < 0.02)[0], 0, 5_000, 32), 0.01
        )
        >= math.log(400)
        for _ in range(100)
    )
    assert found >= 90
    assert log_ceiling_capital(np.array([0.0, 0.1]), 0.0) == math.inf
    assert log_ceiling_capital(np.array([1.0]), 1.0) == -math.inf
