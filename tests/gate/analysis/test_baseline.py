"""The Kayenta-style baseline: Hodges-Lehmann by brute force, classification, scoring, and the
two weaknesses canary-analysis.md names (blind to tails, inflated by repeated looks)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from gate.analysis.baseline import classify, judge_baseline, mann_whitney_hl, score


@pytest.mark.parametrize(("m", "n"), [(7, 9), (40, 33), (120, 150)])
def test_hodges_lehmann_and_interval_match_brute_force(m: int, n: int) -> None:
    rng = np.random.default_rng(m * n)
    e, c = rng.normal(0.3, 1.0, m), rng.normal(0.0, 1.0, n)
    diffs = np.sort((e[:, None] - c[None, :]).ravel())
    result = mann_whitney_hl(e, c)
    assert result.estimate == pytest.approx(float(np.median(diffs)), abs=1e-6)
    assert result.lower <= result.estimate <= result.upper
    # Bauer's interval: from the k-th smallest to the k-th largest difference, k from the
    # normal approximation of the Mann-Whitney statistic at 98%.
    k = int(np.floor(m * n / 2 - 2.3263478740408408 * np.sqrt(m * n * (m + n + 1) / 12)))
    assert result.lower == pytest.approx(diffs[max(k, 1) - 1], abs=1e-6)
    assert result.upper == pytest.approx(diffs[m * n - max(k, 1)], abs=1e-6)
    expected = mannwhitneyu(e, c, alternative="two-sided", method="asymptotic").pvalue
    assert result.pvalue == pytest.approx(expected)


def test_classification() -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(0.0, 0.3, 2_000)
    assert classify(1.3 * rng.lognormal(0.0, 0.3, 2_000), base) == "High"
    assert classify(rng.lognormal(0.0, 0.3, 2_000), base) == "Pass"
    assert classify(np.zeros(0), base) == "Nodata"
    assert classify(base, base) == "Pass"
    assert classify(0.7 * base, base, direction="either") == "Low"
    assert classify(0.7 * base, base) == "Pass"


def test_blind_to_a_tail_only_regression() -> None:
    """Values above the p95 made 30% slower: ranks barely move, so Kayenta passes."""
    rng = np.random.default_rng(2)
    ref = rng.lognormal(0.0, 0.3, 10_000)
    cand = rng.lognormal(0.0, 0.3, 10_000)
    p95 = float(np.exp(0.3 * 1.645))
    cand = np.where(cand > p95, 1.3 * cand, cand)
    assert classify(cand, ref) == "Pass"


def test_scoring_marginal_then_final() -> None:
    assert score({"a": "Pass", "b": "High", "c": "Pass", "d": "Pass"}) == 75.0
    assert score({"a": "Nodata"}) == 0.0
    rng = np.random.default_rng(3)
    good = (rng.normal(size=500), rng.normal(size=500))
    bad = (rng.normal(size=500) + 1.0, rng.normal(size=500))
    # One High of four metrics scores 75: not below marginal, so only the last look fails.
    looks = [{"a": good, "b": good, "c": good, "d": bad}] * 3
    result = judge_baseline(looks)
    assert result.held and result.look == 2
    # Two Highs score 50: the first look fails at once.
    result = judge_baseline([{"a": bad, "b": bad, "c": good, "d": good}] * 3)
    assert result.held and result.look == 0
    assert not judge_baseline([{"a": good, "b": good}] * 3).held
