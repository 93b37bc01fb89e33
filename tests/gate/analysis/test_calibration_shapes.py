"""Judge v3 where it is weakest (issue 28): validity at the tolerance boundary under engine
drift, batches longer than a block and error episodes, and power on regressions shaped like real
ones, on whole simulated gates (the sequential judge with its looks and early stops).

Each cell is seeded, so it is deterministic; the bounds asserted are the gate's own alpha (5%)
for the boundary cells and 1% for A/A with episodes, with the sample sizes said, and the power
cells assert what the published grid (docs/calibration.md, `gate calibrate --shapes`) shows with
a margin."""

from __future__ import annotations

import pytest

from gate.analysis.calibration import AA, Case, SimConfig, calibrate
from gate.analysis.calibration_shapes import (
    BOUNDARY_CASES,
    POWER_CASES,
    STRESS,
    _mirrored,
    short_plan_refusal,
)
from gate.analysis.policy import Policy

P50_BOUNDARY = next(c for c in BOUNDARY_CASES if c.name.startswith("p50"))
TAIL_BOUNDARY = next(c for c in BOUNDARY_CASES if c.name.startswith("p90"))

pytestmark = pytest.mark.simulation  # hundreds of simulated gates per test


def _stress(name: str, size: int) -> SimConfig:
    return next(s for s in STRESS if s.name == name).config(_mirrored(size))


def _held(case: Case, stress: str, size: int, runs: int, seed: int = 7) -> float:
    result = calibrate(Policy(), runs, seed=seed, config=_stress(stress, size), cases=[case])
    return result.cases[0].hold_rate


@pytest.mark.parametrize(
    ("stress", "size"), [("drift 15 s", 1_000), ("batches of 64", 1_000), ("drift 60 s", 2_000)]
)
@pytest.mark.parametrize("case", [P50_BOUNDARY, TAIL_BOUNDARY], ids=lambda c: c.name)
def test_a_candidate_at_its_tolerance_is_held_within_alpha_under_dependence(
    stress: str, size: int, case: Case
) -> None:
    """A candidate exactly at a tolerance, on engines that drift on their own or batch 64
    requests at a time (longer than a block): judge v2 held 6-20x its alpha there. 60 gates
    per cell: at most 3 held (the gate's alpha is 5%). A drift of 60 s is judged over 100 s
    (2,000 requests); over 50 s it is slower than the looks and breaks the bound (the
    published grid says by how much: docs/calibration.md)."""
    assert _held(case, stress, size, 60) <= 3 / 60


def test_identical_engines_with_error_episodes_below_the_ceiling_are_not_held() -> None:
    """10 s bad periods on both engines at a mean failed share of 0.8% (ceiling 1%): judge v2
    held 12-28% of such A/A gates. An episode is one event now: at most 1 of 60 held."""
    assert _held(AA, "error episodes", 2_000, 60) <= 1 / 60


def test_a_candidate_with_many_more_episodes_is_still_held() -> None:
    """Ten times the reference's bad periods is held by a 2,000-request gate in most runs."""
    assert _held(Case("episodes x10", episodes=10.0), "error episodes", 2_000, 12) >= 8 / 12


@pytest.mark.parametrize(
    ("name", "size", "runs", "least"),
    [
        ("3% of requests x4", 1_000, 12, 9),
        ("stall 5 s", 1_000, 12, 9),
        ("a quarter at x2", 1_000, 12, 9),
        ("creep +0% to +40% over the second half", 1_000, 12, 9),
        # The slowest 1% x1.5: about 80-86% held at 2,000 (the grid); 14 of 24 leaves a true
        # 80% a 0.4% chance of failing this test, and judge v2 (0-15%) none of passing it.
        ("p99 x1.5", 2_000, 24, 14),
        ("times out its slowest 1%", 2_000, 12, 9),
    ],
)
def test_regressions_that_are_not_a_steady_shift_are_held(
    name: str, size: int, runs: int, least: int
) -> None:
    """The shapes judge v2 continued on (issue 28's audit: 94-100% continue) are held."""
    case = next(c for c in POWER_CASES if c.name == name)
    assert _held(case, "mirrored", size, runs) >= least / runs


def test_a_plan_too_short_to_decide_is_refused_with_the_size_it_needs() -> None:
    """Planned 120 requests: judge v2 continued 96% of x1.5 candidates on no evidence."""
    refusal = short_plan_refusal(Policy(), planned=120, rate=20.0)
    assert refusal is not None
    assert "120 planned requests" in refusal and "at least 8" in refusal
    assert short_plan_refusal(Policy(), planned=2_000, rate=20.0) is None
    assert short_plan_refusal(Policy(short_scenarios="allow"), planned=120) is None


def test_the_boundary_cases_sit_on_their_tolerances() -> None:
    """The boundary rows are at the tolerances they claim (the p50 case: every request x1.05;
    the tail case: the slowest half x1.10), so a hold there is a false hold."""
    policy = Policy()
    assert P50_BOUNDARY.ttft == pytest.approx(1.0 + policy.tolerance_for(0.5))
    assert TAIL_BOUNDARY.top_factor == pytest.approx(1.0 + policy.tail.tolerance)
    assert TAIL_BOUNDARY.top_factor == pytest.approx(1.0 + policy.tolerance_for(0.9))
