"""Arrival schedules: reproducible, sorted, the right size, and statistically what they claim."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.schedule import build_offsets, spread_offsets

arrivals = st.sampled_from(["poisson", "constant", "gamma"])
rates = st.floats(0.01, 1000.0)
burstiness = st.floats(0.05, 20.0)


@given(arrivals, rates, st.integers(1, 2000), burstiness, st.integers(0, 2**32))
def test_requests_mode_is_sorted_starts_at_zero_and_has_the_length(
    arrival: Any, rate: float, n: int, b: float, seed: int
) -> None:
    offsets = build_offsets(arrival, rate, requests=n, burstiness=b, seed=seed)
    assert offsets.dtype == np.float64
    assert offsets.shape == (n,)
    assert offsets[0] == 0.0
    assert np.all(np.diff(offsets) >= 0)
    assert np.all(np.isfinite(offsets))


@given(arrivals, st.floats(0.1, 200.0), st.floats(0.01, 30.0), burstiness, st.integers(0, 99))
def test_duration_mode_stays_inside_the_duration(
    arrival: Any, rate: float, duration: float, b: float, seed: int
) -> None:
    offsets = build_offsets(arrival, rate, duration_s=duration, burstiness=b, seed=seed)
    assert len(offsets) >= 1
    assert offsets[0] == 0.0
    assert offsets[-1] < duration
    assert np.all(np.diff(offsets) >= 0)


@pytest.mark.parametrize("arrival", ["poisson", "constant", "gamma"])
def test_reproducible_by_seed(arrival: Any) -> None:
    a = build_offsets(arrival, 10.0, requests=500, burstiness=0.5, seed=3)
    b = build_offsets(arrival, 10.0, requests=500, burstiness=0.5, seed=3)
    np.testing.assert_array_equal(a, b)
    c = build_offsets(arrival, 10.0, requests=500, burstiness=0.5, seed=4)
    if arrival == "constant":
        np.testing.assert_array_equal(a, c)
    else:
        assert not np.array_equal(a, c)


def test_duration_mode_reproducible_by_seed() -> None:
    a = build_offsets("poisson", 50.0, duration_s=10.0, seed=1)
    b = build_offsets("poisson", 50.0, duration_s=10.0, seed=1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("arrival", "b"), [("poisson", 1.0), ("gamma", 0.25), ("gamma", 4.0)])
def test_mean_gap_is_one_over_rate(arrival: Any, b: float) -> None:
    rate = 20.0
    gaps = np.diff(build_offsets(arrival, rate, requests=20_001, burstiness=b, seed=11))
    # Standard error of the mean gap is cv/(rate*sqrt(n)); allow 5 standard errors.
    cv = 1 / np.sqrt(b)
    assert abs(gaps.mean() - 1 / rate) < 5 * cv / (rate * np.sqrt(len(gaps)))


def test_gamma_shape_controls_burstiness() -> None:
    def cv(b: float) -> float:
        gaps = np.diff(build_offsets("gamma", 10.0, requests=20_001, burstiness=b, seed=5))
        return float(gaps.std() / gaps.mean())

    assert cv(0.25) == pytest.approx(2.0, rel=0.05)  # cv of gamma(k) is 1/sqrt(k)
    assert cv(4.0) == pytest.approx(0.5, rel=0.05)
    poisson = np.diff(build_offsets("poisson", 10.0, requests=20_001, seed=5))
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)


def test_constant_is_exact() -> None:
    offsets = build_offsets("constant", 4.0, requests=5)
    np.testing.assert_array_equal(offsets, [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(build_offsets("constant", 4.0, duration_s=1.0), offsets[:4])


def test_poisson_duration_count_matches_rate() -> None:
    offsets = build_offsets("poisson", 100.0, duration_s=100.0, seed=2)
    assert abs(len(offsets) - 10_000) < 5 * np.sqrt(10_000)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"arrival": "uniform", "rate": 1.0, "requests": 1}, "arrival"),
        ({"arrival": "poisson", "rate": 0.0, "requests": 1}, "rate"),
        ({"arrival": "poisson", "rate": float("inf"), "requests": 1}, "rate"),
        ({"arrival": "poisson", "rate": float("nan"), "requests": 1}, "rate"),
        ({"arrival": "poisson", "rate": "fast", "requests": 1}, "rate"),
        ({"arrival": "poisson", "rate": 1.0}, "requests/duration_s"),
        ({"arrival": "poisson", "rate": 1.0, "requests": 1, "duration_s": 1.0}, "requests"),
        ({"arrival": "poisson", "rate": 1.0, "requests": 0}, "requests"),
        ({"arrival": "poisson", "rate": 1.0, "requests": 2.5}, "requests"),
        ({"arrival": "poisson", "rate": 1.0, "requests": True}, "requests"),
        ({"arrival": "poisson", "rate": 1.0, "duration_s": -1.0}, "duration_s"),
        ({"arrival": "poisson", "rate": 1e9, "duration_s": 1e9}, "duration_s"),
        ({"arrival": "gamma", "rate": 1.0, "requests": 1, "burstiness": 0.0}, "burstiness"),
        ({"arrival": "poisson", "rate": 1.0, "requests": 1, "seed": -1}, "seed"),
    ],
)
def test_bad_input_names_the_parameter(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}"):
        build_offsets(**kwargs)


def test_numpy_integer_request_count_is_accepted() -> None:
    assert len(build_offsets("poisson", 1.0, requests=np.int64(3))) == 3  # type: ignore[arg-type]


# --------------------------------------------------------------------------- a fixed count


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "constant"])
def test_spread_offsets_sends_exactly_the_count_inside_the_window(arrival: Any) -> None:
    for n in (1, 2, 81, 500):
        t = spread_offsets(arrival, n, 2.0, burstiness=0.5, seed=3)
        assert len(t) == n and t[0] == 0.0 and t[-1] < 2.0
        assert np.all(np.diff(t) >= 0)


def test_spread_offsets_is_poisson_conditioned_on_its_count() -> None:
    # Given n arrivals in a window, a Poisson process's instants are uniform there: the
    # pooled offsets of many seeds fill the window evenly (a KS distance near 0), while the
    # counts of build_offsets over the same window spread by about sqrt(n).
    n, window = 80, 2.0
    pooled = np.concatenate([spread_offsets("poisson", n, window, seed=s)[1:] for s in range(200)])
    u = np.sort(pooled / window)
    ks = np.max(np.abs(u - (np.arange(1, u.size + 1) / u.size)))
    assert ks < 0.02
    counts = [
        len(build_offsets("poisson", n / window, duration_s=window, seed=s)) for s in range(200)
    ]
    assert np.std(counts) > 5  # what the fixed count takes away: sqrt(80) is about 9


def test_spread_offsets_of_one_seed_share_their_shape_across_counts() -> None:
    # The first gaps are the same draws at any count: a capacity search's steps at nearby
    # rates see nearly the same traffic shape (common random numbers).
    a = spread_offsets("poisson", 80, 2.0, seed=7)
    b = spread_offsets("poisson", 88, 2.0, seed=7)
    assert np.corrcoef(np.diff(a)[:40], np.diff(b)[:40])[0, 1] > 0.95


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("poisson", 0, 1.0), "requests"),
        (("poisson", 5, 0.0), "duration_s"),
        (("poisson", 5, float("nan")), "duration_s"),
    ],
)
def test_spread_offsets_names_bad_input(args: Any, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}"):
        spread_offsets(*args)


# --------------------------------------------------------------------------- phased schedules

from loadgen.schedule import Phase, build_phased  # noqa: E402


def test_phased_schedule_is_reproducible_and_marks_phases() -> None:
    phases = [
        Phase("baseline", 10, 10),
        Phase("ramp", 10, 10, 50),
        Phase("overload", 5, 80, arrival="constant"),
        Phase("idle", 2, 0),
        Phase("recovery", 10, 10, arrival="gamma", burstiness=0.5),
    ]
    a = build_phased(phases, seed=3)
    b = build_phased(phases, seed=3)
    np.testing.assert_array_equal(a.offsets_s, b.offsets_s)
    np.testing.assert_array_equal(a.phase_index, b.phase_index)
    assert not np.array_equal(a.offsets_s, build_phased(phases, seed=4).offsets_s)
    assert a.offsets_s[0] == 0.0
    assert np.all(np.diff(a.offsets_s) >= 0)
    assert a.starts_s == [0.0, 10.0, 20.0, 25.0, 27.0]
    assert a.duration_s == 37.0
    counts = np.bincount(a.phase_index, minlength=5)
    assert counts[2] == 400  # constant: exactly rate * duration
    assert counts[3] == 0  # an idle phase sends nothing
    for k, start in enumerate(a.starts_s):
        mine = a.offsets_s[a.phase_index == k]
        assert np.all((mine >= start) & (mine < start + phases[k].duration_s))
    assert set(a.phase_names()) == {"baseline", "ramp", "overload", "recovery"}


def test_ramp_rate_rises_linearly() -> None:
    s = build_phased([Phase("ramp", 100.0, 10.0, 90.0)], seed=1)
    first, last = np.histogram(s.offsets_s, bins=[0, 10, 90, 100])[0][[0, 2]]
    # Expected 150 requests in the first 10 s (rate 10 -> 18) and 870 in the last (82 -> 90).
    assert abs(first - 140) < 5 * np.sqrt(140)
    assert abs(last - 860) < 5 * np.sqrt(860)
    assert abs(len(s.offsets_s) - 5000) < 5 * np.sqrt(5000)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"name": "", "duration_s": 1, "rate": 1}, "name"),
        ({"name": "a", "duration_s": 0, "rate": 1}, "duration_s"),
        ({"name": "a", "duration_s": 1, "rate": -1}, "rate"),
        ({"name": "a", "duration_s": 1, "rate": 1, "end_rate": float("nan")}, "end_rate"),
        ({"name": "a", "duration_s": 1, "rate": 1, "arrival": "x"}, "arrival"),
    ],
)
def test_phase_validation_names_the_field(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}"):
        Phase(**kwargs)


def test_phase_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        build_phased([Phase("a", 1, 1), Phase("a", 1, 1)])
