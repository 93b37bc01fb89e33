"""The capacity check (issue 33): the ratio interval built from both engines' brackets, and the
decision against the tolerance, at the boundary and with open brackets."""

from __future__ import annotations

import math

import pytest

from gate.analysis.capacity import (
    CapacitySearch,
    CapacityStep,
    EngineStep,
    capacity_check,
    ratio_interval,
)
from gate.analysis.judge import judge
from gate.analysis.policy import Policy
from loadgen.suite.capacity import Bracket


def step(rate: float, ref: float, cand: float, n: int = 100) -> CapacityStep:
    return CapacityStep(
        rate,
        "bisect",
        {
            "reference": EngineStep(n, round(ref * n), 40.0, 12.0),
            "candidate": EngineStep(n, round(cand * n), 41.0, 12.0),
        },
    )


def search(steps: list[CapacityStep], **kw: object) -> CapacitySearch:
    return CapacitySearch("cap", 0.95, 0.03, steps, "done", "TTFT <= 250 ms", **kw)  # type: ignore[arg-type]


def test_the_interval_is_lo_c_over_hi_r_to_hi_c_over_lo_r() -> None:
    assert ratio_interval(Bracket(40, 42), Bracket(34, 35)) == pytest.approx((34 / 42, 35 / 40))
    # Open ends: a candidate that missed at the start could be anywhere below; a reference that
    # never missed leaves the ratio unbounded below.
    assert ratio_interval(Bracket(40, 42), Bracket(None, 10)) == (0.0, 10 / 40)
    assert ratio_interval(Bracket(40, None), Bracket(34, 35))[0] == 0.0
    assert ratio_interval(Bracket(40, 42), Bracket(100, None))[1] == math.inf


def test_a_loss_beyond_the_tolerance_fails_and_names_capacity() -> None:
    # reference between 48.6 and 50, candidate between 41.7 and 42.8: ratio at most 0.88
    s = search([step(41.7, 1, 1), step(42.8, 1, 0.7), step(48.6, 1, 0.5), step(50.0, 0.6, 0.4)])
    c = capacity_check(s, Policy())
    assert c.decision == "fail" and c.holds and c.group == "capacity"
    assert c.id == "cap.capacity" and c.threshold == pytest.approx(0.92)
    assert c.interval == pytest.approx((41.7 / 50.0, 42.8 / 48.6))
    assert "candidate 41.7 to 42.8 req/s" in c.message and "less than 92%" in c.message
    assert c.ratio == pytest.approx(math.sqrt(41.7 * 42.8) / math.sqrt(48.6 * 50))


def test_equal_capacities_pass() -> None:
    s = search([step(48.6, 1, 1), step(50.0, 0.5, 0.4)])
    c = capacity_check(s, Policy())
    assert c.decision == "pass" and not c.holds
    assert c.interval == pytest.approx((48.6 / 50.0, 50.0 / 48.6))


def test_an_interval_that_straddles_the_floor_is_undecided_and_held_only_when_required() -> None:
    # candidate between 43 and 46, reference between 48.6 and 50: [0.86, 0.946] straddles 0.92
    steps = [step(43, 1, 1), step(46, 1, 0.5), step(48.6, 1, 0.5), step(50, 0.5, 0.5)]
    c = capacity_check(search(steps), Policy())
    assert c.decision == "undecided" and not c.required and not c.holds
    required = capacity_check(search(steps, require_decided=True), Policy())
    assert required.decision == "undecided" and required.holds


def test_the_tolerance_is_the_policys() -> None:
    s = search([step(41.7, 1, 1), step(42.8, 1, 0.7), step(48.6, 1, 0.5), step(50.0, 0.6, 0.4)])
    loose = Policy.model_validate({"load": {"capacity_tolerance": 0.2}})
    assert capacity_check(s, loose).decision == "pass"  # 0.834 >= 0.80


def test_an_open_interval_has_no_infinite_bound_in_the_check() -> None:
    # Neither engine ever missed: capacity at least max_rate for both; undecided, no infinity
    s = search([step(100, 1, 1)])
    c = capacity_check(s, Policy())
    assert c.decision == "undecided" and c.interval is None
    assert "never missed" in c.message


def test_the_judge_holds_on_capacity_alone() -> None:
    s = search([step(41.7, 1, 1), step(42.8, 1, 0.7), step(48.6, 1, 0.5), step(50.0, 0.6, 0.4)])
    v = judge([], [], Policy(), capacities=[s])
    assert v.decision == "hold"
    assert "cap.capacity" in [c.id for c in v.reasons]


# The guard against knees the host's CPUs set (gate/analysis/capacity.py, "Compute the engines
# competed for"): on a two-core host identical CPU vLLM servers measured ratios of 0.39-1.68
# (docs/calibration/capacity-vllm.json), so a search whose knee steps ran under CPU contention
# must not decide, whichever way its interval points.


def busy(s: CapacityStep, stall: float | None, cpu: float | None = 0.5) -> CapacityStep:
    return CapacityStep(s.rate, s.stage, s.engines, cpu, stall)


LOSS = [step(41.7, 1, 1), step(42.8, 1, 0.7), step(48.6, 1, 0.5), step(50.0, 0.6, 0.4)]


def test_a_fail_whose_knee_steps_stalled_is_undecided_and_says_why() -> None:
    steps = [busy(s, 0.9) if s.rate == 42.8 else busy(s, 0.1) for s in LOSS]
    s = search(steps, shares_host=True)
    assert s.knee_cpu() == ("stall", 0.9, 42.8)
    c = capacity_check(s, Policy())
    # undecided, and it holds, required or not: the comparison asked for could not be made
    # (as an unhealthy test bed holds on gate.environment), and a continue would let a real
    # loss through unseen
    assert c.decision == "undecided" and c.required and c.holds
    assert "waited for the gate host's CPUs 90% of the time at 42.8 req/s" in c.message
    assert "competed for its CPUs" in c.message and "capacity_cpu_stall" in c.message
    assert c.interval == pytest.approx((41.7 / 50.0, 42.8 / 48.6))  # the evidence is kept


def test_a_pass_on_stalled_knees_is_undecided_too() -> None:
    steps = [busy(step(48.6, 1, 1), 0.6), busy(step(50.0, 0.5, 0.4), 0.7)]
    c = capacity_check(search(steps), Policy())
    assert c.decision == "undecided" and c.holds
    # engines not known to share the host: the load generator is what is named first
    assert "load generator may not have sent the schedule on time" in c.message
    assert "competed for its CPUs with each other" not in c.message


def test_busy_cpus_that_stall_nobody_leave_the_decision_to_the_interval() -> None:
    # An engine that spins its own cores (OpenMP threads waiting for work) keeps them busy
    # without making anyone wait: with a stall reading, busy is not read.
    steps = [busy(s, 0.05, cpu=1.0) for s in LOSS]
    assert capacity_check(search(steps), Policy()).decision == "fail"


def test_without_stall_readings_busy_cpus_are_the_guard() -> None:
    steps = [busy(s, None, cpu=0.99) for s in LOSS]
    assert search(steps).knee_cpu() == ("busy", 0.99, 50.0)
    c = capacity_check(search(steps), Policy())
    assert c.decision == "undecided" and "99% busy (no CPU pressure readings)" in c.message
    assert capacity_check(search([busy(s, None, cpu=0.9) for s in LOSS]), Policy()).decision == (
        "fail"
    )


def test_only_the_steps_that_bound_a_knee_count() -> None:
    # A stalled step far above both knees (the ramp's overshoot) bounds no bracket: the
    # brackets are reference [48.6, 50], candidate [41.7, 42.8]; 60/s is above both his.
    steps = [*(busy(s, 0.2) for s in LOSS), busy(step(60.0, 0.1, 0.1), 1.0)]
    s = search(steps, shares_host=True)
    assert s.knee_rates() == {41.7, 42.8, 48.6, 50.0}
    assert s.knee_cpu() == ("stall", 0.2, 50.0)  # the worst edge step, ties to the higher rate
    assert capacity_check(s, Policy()).decision == "fail"


def test_the_limits_are_the_policys_and_inclusive() -> None:
    steps = [busy(s, 0.5) for s in LOSS]
    assert capacity_check(search(steps), Policy()).decision == "fail"  # 0.5 is not above 0.5
    strict = Policy.model_validate({"load": {"capacity_cpu_stall": 0.4}})
    assert capacity_check(search(steps), strict).decision == "undecided"
    off = Policy.model_validate({"load": {"capacity_cpu_stall": 1.0}})
    assert capacity_check(search([busy(s, 1.0) for s in LOSS]), off).decision == "fail"
    with pytest.raises(ValueError, match="capacity_cpu_stall"):
        Policy.model_validate({"load": {"capacity_cpu_stall": 1.5}})


def test_an_operator_can_make_a_contended_capacity_check_advisory() -> None:
    # policy.advisory (gate/analysis/advisory.py): judged as any other, it never holds
    steps = [busy(s, 0.9) for s in LOSS]
    assert judge([], [], Policy(), capacities=[search(steps)]).decision == "hold"
    advisory = Policy.model_validate({"advisory": ["*.capacity"]})
    v = judge([], [], advisory, capacities=[search(steps)])
    c = next(c for c in v.checks if c.id == "cap.capacity")
    assert c.decision == "undecided" and c.advisory and not c.holds
    assert "cap.capacity" not in [r.id for r in v.reasons]


def test_steps_without_a_cpu_reading_leave_the_decision_to_the_interval() -> None:
    assert search(LOSS).knee_cpu() is None
    assert capacity_check(search(LOSS), Policy()).decision == "fail"
