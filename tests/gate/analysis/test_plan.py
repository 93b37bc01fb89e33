"""The plan (plan.py, judge v3): blocks in time from the schedule, the looks, the tolerances of
the shape checks, and a scenario too short to decide refused before the load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate.analysis.judge import judge
from gate.analysis.paired import MIN_BLOCKS, Layout
from gate.analysis.plan import Plan, ShortScenario, tolerance_of
from gate.analysis.policy import Policy
from gate.analysis.types import ArmSamples, EngineFacts, ScenarioSamples


def test_a_scenario_of_fewer_than_min_blocks_is_refused_with_the_size_it_needs() -> None:
    """100 requests make 3 blocks of 32: the plan refuses before the load, naming the
    scenario, its blocks and the size that makes MIN_BLOCKS, and how to run it anyway."""
    with pytest.raises(ShortScenario) as info:
        Plan.build(Policy(), {"steady": 4_000, "tiny": 100})
    err = info.value
    assert isinstance(err, ValueError)
    # Blocks of 32 requests, a trailing half block kept: 7 x 32 + 16 = 240 is the least.
    assert (err.scenario, err.planned, err.blocks, err.need) == ("tiny", 100, 3, 240)
    text = str(err)
    assert "scenario 'tiny': 100 planned requests per engine make 3 time blocks" in text
    assert f"need at least {MIN_BLOCKS}" in text
    assert "about 240 per engine" in text
    assert "short_scenarios: allow" in text
    assert Layout.build(240).planned_blocks >= MIN_BLOCKS > Layout.build(239).planned_blocks
    Plan.build(Policy(), {"steady": 4_000, "tiny": 240})


def test_the_size_named_is_enough() -> None:
    """For every size too short without send times, the size the refusal names plans at least
    MIN_BLOCKS blocks (and is more than the size refused); in time, sent at the same rate.
    (It once scaled the size by MIN_BLOCKS / blocks, ignoring the blocks' floors: 177 named
    236, still 7 blocks.)"""
    fast = np.arange(100) / 100.0
    with pytest.raises(ShortScenario) as info:
        Plan.build(Policy(), {"s": 100}, times={"s": fast})
    need = info.value.need
    assert Layout.build(need, times=np.arange(need) / 100.0).planned_blocks >= MIN_BLOCKS
    refused = 0
    for n in range(1, 300):
        if Layout.build(n).planned_blocks >= MIN_BLOCKS:
            continue
        with pytest.raises(ShortScenario) as named:
            Plan.build(Policy(), {"s": n})
        refused += 1
        assert named.value.need > n
        assert Layout.build(named.value.need).planned_blocks >= MIN_BLOCKS, (n, named.value.need)
        Plan.build(Policy(), {"s": named.value.need})
    assert refused > 200


def test_a_short_scenario_in_time_is_refused_too() -> None:
    """600 requests at 100/s last 6 s: three blocks of MIN_BLOCK_S. The size named, sent at
    the same rate, makes enough blocks."""
    times = {"fast": np.arange(600) / 100.0}
    with pytest.raises(ShortScenario, match="'fast': 600 planned requests") as info:
        Plan.build(Policy(), {"fast": 600}, times=times)
    need = info.value.need
    assert info.value.blocks == 3
    plan = Plan.build(Policy(), {"fast": need}, times={"fast": np.arange(need) / 100.0})
    assert plan.layout("fast").planned_blocks >= MIN_BLOCKS


def test_short_scenarios_allow_or_short_ok_plan_it_anyway() -> None:
    """policy.short_scenarios 'allow' plans every short scenario; short_ok plans only those it
    names. The plan says the latency of such a scenario will stay undecided."""
    allow = Plan.build(Policy(short_scenarios="allow"), {"tiny": 100, "also": 50})
    assert allow.layout("tiny").planned_blocks == 3
    assert any(
        n.startswith("tiny:") and "its latency will stay undecided" in n for n in allow.notes
    )
    ok = Plan.build(Policy(), {"tiny": 100, "steady": 4_000}, short_ok={"tiny"})
    assert ok.layout("tiny").planned_blocks == 3
    with pytest.raises(ShortScenario, match="'also'"):
        Plan.build(Policy(), {"tiny": 100, "also": 50}, short_ok={"tiny"})


def test_an_allowed_short_scenario_leaves_its_latency_undecided() -> None:
    """Judged under a plan that allowed it, a 100-request scenario has too few blocks for any
    paired check: undecided (the first check of each metric holds, being the only latency
    evidence there is), never failed or passed."""
    policy = Policy(short_scenarios="allow")
    plan = Plan.build(policy, {"tiny": 100})
    rng = np.random.default_rng(1)

    def arm() -> ArmSamples:
        x = rng.lognormal(math.log(100.0), 0.1, 100)
        return ArmSamples(requests=100, ttft_ms=x, itl_ms=x / 10.0)

    engines = (EngineFacts("reference", 60.0), EngineFacts("candidate", 60.0))
    verdict = judge([ScenarioSamples("tiny", arm(), arm())], engines, policy, plan=plan)
    latency = [c for c in verdict.checks if c.group == "latency"]
    assert latency and all(c.decision == "undecided" for c in latency)
    assert "cannot be compared" in next(c for c in latency if c.id == "tiny.ttft.p50").message


def test_blocks_in_time_where_the_schedule_gives_them() -> None:
    """times: per scenario, the intended send offsets: that scenario's blocks are in time, the
    others' in request counts; the looks are every look_every requests, the planned size and
    the limit."""
    times = {"paced": np.arange(4_000) / 20.0}
    plan = Plan.build(Policy(require=["ttft.p50"]), {"paced": 4_000, "counted": 4_000}, times=times)
    assert plan.layout("paced").block_s == pytest.approx(199.95 / 32)
    assert plan.layout("counted").block_s is None
    assert plan.layout("paced") == Layout.build(4_000, 6_000, times["paced"])
    assert plan.limit("paced") == 6_000
    assert plan.look_sizes("paced") == tuple(range(500, 6_001, 500))
    odd = Plan.build(Policy(look_every=300), {"s": 1_000})
    assert odd.look_sizes("s") == (300, 600, 900, 1_000)
    assert any("32 blocks of 6.25 s" in n for n in plan.notes)


def test_tolerances_of_each_kind() -> None:
    policy = Policy(window_tolerance=0.4, creep_tolerance=0.2)
    assert tolerance_of(policy, None, "window") == 0.4
    assert tolerance_of(policy, None, "creep") == 0.2
    assert tolerance_of(policy, None, "tail") == policy.tail.tolerance == 0.10
    assert tolerance_of(policy, 0.5) == 0.05 and tolerance_of(policy, 0.9) == 0.10


def test_an_allowed_short_scenario_leaves_its_latency_undecided_and_continues() -> None:
    """`short_scenarios: allow` runs a scenario too short to decide 'with its latency
    undecided', as the refusal says: its checks are not shown, and identical engines continue
    (without the allowance the same samples hold: a scenario the spec asked for is never
    silently skipped)."""
    rng = np.random.default_rng(3)
    x = rng.lognormal(4.0, 0.2, 40)
    arm = ArmSamples(requests=40, ttft_ms=x, itl_ms=x / 10)
    samples = [ScenarioSamples("steady", arm, arm)]
    facts = [EngineFacts("reference", 1.0), EngineFacts("candidate", 1.0)]
    allowed = judge(samples, facts, Policy(short_scenarios="allow"))
    p50 = next(c for c in allowed.checks if c.id == "steady.ttft.p50")
    assert p50.decision == "undecided" and not p50.required and p50.not_shown
    assert "the policy allows short scenarios" in p50.message
    assert allowed.decision == "continue", [c.message for c in allowed.reasons]
    strict = judge(samples, facts, Policy())
    assert strict.decision == "hold"
    assert any(c.id == "steady.ttft.p50" for c in strict.reasons)
