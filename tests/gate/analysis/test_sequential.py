"""The plan and the sequential judge: fixed tuning across looks, early stops, agreement with the
final judge, and A/A false holds over many looks within alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from gate.analysis.judge import judge
from gate.analysis.paired import block_length, block_stats, block_test, tune_g
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.sequential import SequentialJudge
from gate.analysis.types import ArmSamples, EngineFacts, ScenarioSamples

ENGINES = (EngineFacts("reference", 60.0), EngineFacts("candidate", 62.0))


def stream(seed: int, n: int, scale: float = 1.0, sigma: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(math.log(100.0), sigma, n) * scale


def arm(ttft: np.ndarray, itl: np.ndarray | None = None) -> ArmSamples:
    return ArmSamples(
        requests=int(ttft.size),
        ttft_ms=ttft,
        itl_ms=ttft / 10.0 if itl is None else itl,
    )


def test_plan_fixes_blocks_prior_and_alpha_in_advance() -> None:
    plan = Plan.build(Policy(), {"steady": 20_000, "short": 300})
    steady = plan.checks_for("steady")
    assert [c.q for c in steady] == [0.5, 0.9, 0.5, 0.9, None, None]
    assert {c.block for c in steady} == {block_length(20_000)} == {79}
    assert {c.g for c in steady if c.q is not None} == {tune_g(20_000 // 79, steady[0].alpha)}
    # Hold on evidence: no check is required unless the policy says so, at any size.
    assert not any(c.required for c in plan.latency + plan.tails)
    short = plan.checks_for("short")
    assert [c.q for c in short if c.metric == "ttft"] == [0.5, 0.9, None]
    assert [c.block for c in short if c.metric == "ttft"] == [32, 32, 40]  # tail: 2 of 5%
    assert any(
        n.startswith("short: 300 planned requests per engine in 9 blocks of 32") for n in plan.notes
    )
    assert any("can detect TTFT p50 +" in n for n in plan.notes)
    assert math.fsum(c.alpha for c in plan.latency) == pytest.approx(
        Policy().group_alpha("latency")
    )
    assert math.fsum(c.alpha for c in plan.tails) == pytest.approx(Policy().group_alpha("tail"))
    assert plan.error_alpha == pytest.approx(Policy().group_alpha("errors") / 2)
    with pytest.raises(ValueError, match="planned requests"):
        Plan.build(Policy(), {"x": 0})


def test_the_plan_says_what_size_detect_needs() -> None:
    policy = Policy(detect={"ttft.p50": 0.10})
    small = Plan.build(policy, {"steady": 300})
    need = int(next(n for n in small.notes if "needs" in n).split("needs ")[1].split()[0])
    assert "raise requests to" in " ".join(small.notes)
    big = Plan.build(policy, {"steady": need})
    assert "(planned)" in " ".join(big.notes)
    # The size it names does detect +10% with at least the power it promises, on the noise
    # it assumed (independent pairs, log-ratio sd 0.3).
    rng = np.random.default_rng(7)
    held = 0
    for _ in range(40):
        ref = 100.0 * np.exp(rng.normal(0.0, 0.3 / math.sqrt(2), need))
        cand = 110.0 * np.exp(rng.normal(0.0, 0.3 / math.sqrt(2), need))
        v = judge([ScenarioSamples("steady", arm(ref), arm(cand))], ENGINES, policy, plan=big)
        held += any(c.id == "steady.ttft.p50" and c.decision == "fail" for c in v.checks)
    assert held >= 40 * 0.7


def test_a_big_regression_stops_the_scenario_early() -> None:
    plan = Plan.build(Policy(), {"steady": 10_000})
    sj = SequentialJudge(plan)
    ref, cand = stream(1, 10_000), stream(2, 10_000, scale=1.5)
    stopped = None
    for t in range(500, 10_001, 500):
        look = sj.look("steady", arm(ref[:t]), arm(cand[:t]))
        if look.stop:
            stopped = (t, look)
            break
    assert stopped is not None
    t, look = stopped
    assert t <= 1_000
    assert look.hold and not look.at_limit
    failed = {c.id for c in look.checks if c.decision == "fail"}
    assert "steady.ttft.p50" in failed
    assert failed <= look.decided


def test_a_clean_scenario_runs_to_its_limit_and_then_everything_is_decided() -> None:
    plan = Plan.build(Policy(), {"steady": 4_000})
    sj = SequentialJudge(plan)
    ref, cand = stream(3, 4_000), stream(4, 4_000)
    look = sj.look("steady", arm(ref[:2_000]), arm(cand[:2_000]))
    # Errors can only fail early (the count test never accepts): not decided before the end.
    assert "steady.errors" in look.undecided
    assert not look.stop
    final = sj.look("steady", arm(ref), arm(cand))
    # No check is required, so the plan allows no extension: the planned size is the end.
    assert final.past_plan and final.all_decided and final.stop
    assert not final.extending and final.at_limit and final.limit == 4_000
    assert not final.hold
    assert Plan.build(Policy(require=["p50"]), {"steady": 4_000}).limit("steady") == 6_000


def test_the_final_judge_with_the_plan_agrees_with_the_last_look() -> None:
    policy = Policy()
    plan = Plan.build(policy, {"steady": 6_000})
    ref, cand = stream(5, 3_000), stream(6, 3_000, scale=1.2)
    look = SequentialJudge(plan).look("steady", arm(ref), arm(cand))
    verdict = judge([ScenarioSamples("steady", arm(ref), arm(cand))], ENGINES, policy, plan=plan)
    by_id = {c.id: c for c in verdict.checks}
    for c in look.checks:
        if c.group == "latency" and c.id in by_id:
            assert by_id[c.id].decision == c.decision
            assert by_id[c.id].interval == c.interval
            assert by_id[c.id].estimate_interval == c.estimate_interval
    assert {c.id for c in look.checks if c.group == "latency"} <= set(by_id)
    assert by_id["steady.ttft.p50"].decision == "fail"
    with pytest.raises(ValueError, match="another policy"):
        judge([], ENGINES, Policy(alpha=0.01), plan=plan)
    with pytest.raises(ValueError, match="not in the plan"):
        SequentialJudge(plan).look("other", arm(ref), arm(cand))


def test_the_planned_test_is_the_same_at_every_look() -> None:
    """What makes the looks free: the blocks and the prior at size t come from the plan,
    never from the look."""
    plan = Plan.build(Policy(), {"steady": 8_000})
    c = plan.checks_for("steady")[1]
    assert (c.block, c.g) == (block_length(8_000), tune_g(8_000 // c.block, c.alpha))
    ref, cand = stream(21, 2_000), stream(22, 2_000)
    look = SequentialJudge(plan).look("steady", arm(ref), arm(cand))
    got = next(x for x in look.checks if x.id == c.id)
    bt = block_test(block_stats(ref, cand, c.block, c.q), c.alpha, c.g)
    assert got.interval == pytest.approx((math.exp(bt.lower), math.exp(bt.upper)))
    # Planned at 300 the same prefix is judged by another prior: a look is not a plan.
    other = Plan.build(Policy(), {"steady": 300}).checks_for("steady")[1]
    assert other.g != c.g


@settings(max_examples=4, deadline=None, derandomize=True)
@given(
    sigma=st.floats(0.1, 0.6),
    batch_sigma=st.floats(0.0, 0.15),
    drift=st.floats(0.0, 0.1),
    look_every=st.sampled_from([100, 250, 1_000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_aa_over_many_looks_never_exceeds_alpha(
    sigma: float, batch_sigma: float, drift: float, look_every: int, seed: int
) -> None:
    """A/A gates with batch effects and a drift both arms share, looked at every `look_every`
    requests up to 4,000 and stopped on the first failure: the fraction that ever failed a
    latency check stays within the latency budget (Ville), however often the gate looks."""
    policy = Policy(look_every=look_every)
    limit, runs = 4_000, 30
    plan = Plan.build(policy, {"steady": limit})
    budget = policy.group_alpha("latency")
    rng = np.random.default_rng(seed)
    t_send = np.arange(limit) / 20.0
    failures = 0
    for _ in range(runs):
        shared = 1.0 + drift * np.sin(2 * math.pi * t_send / 300.0 + rng.uniform(0, 6.3))

        def one_arm(shared: np.ndarray) -> np.ndarray:
            batch = np.repeat(rng.normal(0.0, batch_sigma, limit // 8 + 1), 8)[:limit]
            return np.asarray(100.0 * np.exp(rng.normal(0.0, sigma, limit) + batch) * shared)

        ref, cand = one_arm(shared), one_arm(shared)
        sj = SequentialJudge(plan)
        for t in range(look_every, limit + 1, look_every):
            look = sj.look("steady", arm(ref[:t], ref[:t] / 5.0), arm(cand[:t], cand[:t] / 5.0))
            if any(c.decision == "fail" for c in look.checks if c.group == "latency"):
                failures += 1
                break
    assert failures <= binom.ppf(0.999, runs, budget)


def test_the_plan_extends_only_what_may_run_on() -> None:
    policy = Policy(extend=0.5, require=["ttft.p50"])
    plan = Plan.build(policy, {"a": 1_000, "b": 1_001, "c": 7}, extendable={"a", "b"})
    assert plan.limit("a") == 1_500 and plan.limit("b") == 1_502  # 500.5 rounded up
    assert plan.limit("c") == 7
    assert Plan.build(Policy(extend=0.0, require=["p50"]), {"a": 1_000}).limit("a") == 1_000
    assert Plan.build(Policy(require=["p50"]), {"a": 1_000}).limit("a") == 1_500
    # Only a required check can be left undecided in a way that holds: nothing else extends.
    assert Plan.build(Policy(), {"a": 1_000}).limit("a") == 1_000


def test_an_undecided_check_at_the_planned_size_runs_on_to_the_limit() -> None:
    """A candidate sitting exactly on the p50 threshold can never be decided: when the policy
    requires p50, the scenario extends at the planned size instead of holding, and at the
    limit it holds inconclusive."""
    policy = Policy(extend=0.5, require=["ttft.p50"])
    plan = Plan.build(policy, {"steady": 2_000})
    sj = SequentialJudge(plan)
    ref = stream(11, 3_000)
    cand = stream(12, 3_000, scale=1.05)  # p50 tolerance is 5%: the ratio is the threshold
    at_plan = sj.look("steady", arm(ref[:2_000]), arm(cand[:2_000]))
    assert at_plan.past_plan and at_plan.extending and not at_plan.stop
    assert not at_plan.hold
    assert "steady.ttft.p50" in at_plan.undecided
    assert any("runs past its planned 2000" in n and "steady.ttft.p50" in n for n in at_plan.notes)
    # Errors stay undecided while extending: only a count that breaks the ceiling at the
    # limit could fail them now.
    assert "steady.errors" in at_plan.undecided
    midway = sj.look("steady", arm(ref[:2_500]), arm(cand[:2_500]))
    assert midway.extending and not midway.stop
    end = sj.look("steady", arm(ref), arm(cand))
    assert end.at_limit and end.stop and not end.extending
    assert end.all_decided
    assert any(c.decision == "undecided" and c.holds for c in end.checks)


def test_extending_is_never_a_way_out_of_a_failed_check() -> None:
    plan = Plan.build(Policy(extend=1.0), {"steady": 2_000})
    ref, cand = stream(13, 2_000), stream(14, 2_000, scale=1.5)
    look = SequentialJudge(plan).look("steady", arm(ref), arm(cand))
    assert look.hold and look.stop and not look.extending


def test_without_extension_the_planned_size_is_the_end() -> None:
    plan = Plan.build(Policy(extend=0.0), {"steady": 2_000})
    ref, cand = stream(11, 2_000), stream(12, 2_000, scale=1.05)
    look = SequentialJudge(plan).look("steady", arm(ref), arm(cand))
    assert look.at_limit and look.stop and not look.extending
    assert any(c.decision == "undecided" for c in look.checks)
