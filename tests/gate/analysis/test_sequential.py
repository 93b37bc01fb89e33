"""The plan and the sequential judge (judge v3): blocks and looks fixed by the plan, early stops
both ways (a hold on evidence, a continue once every check passes), agreement with the final
judge, and A/A false holds over many looks within alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from gate.analysis.judge import judge
from gate.analysis.paired import MIN_TEST_BLOCKS, Layout
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


def test_plan_fixes_blocks_looks_and_alpha_in_advance() -> None:
    """Per scenario and metric: p50, p90, a window and a creep check in the latency budget and
    a tail check in the tail budget, each with an equal share; the blocks (Layout) and the
    looks (every look_every requests, with the planned size) are the plan's, not a look's."""
    plan = Plan.build(Policy(), {"steady": 20_000, "short": 300})
    steady = plan.checks_for("steady")
    assert [(c.metric, c.q, c.kind) for c in steady] == [
        ("ttft", 0.5, "quantile"),
        ("ttft", 0.9, "quantile"),
        ("ttft", None, "window"),
        ("ttft", None, "creep"),
        ("itl", 0.5, "quantile"),
        ("itl", 0.9, "quantile"),
        ("itl", None, "window"),
        ("itl", None, "creep"),
        ("ttft", None, "tail"),
        ("itl", None, "tail"),
    ]
    assert [c.key for c in steady[:4]] == ["ttft.p50", "ttft.p90", "ttft.window", "ttft.creep"]
    assert (
        plan.layout("steady") == Layout.build(20_000) and plan.layout("steady").per_block() == 625
    )
    assert plan.look_sizes("steady") == tuple(range(500, 20_001, 500))
    assert plan.look_sizes("short") == (300,)
    # Hold on evidence: no check is required unless the policy says so, at any size.
    assert not any(c.required for c in plan.latency + plan.tails)
    assert {c.beta for c in plan.latency + plan.tails} == {Policy().beta}
    short = plan.checks_for("short")
    assert [c.kind for c in short if c.metric == "ttft"] == [
        "quantile",
        "quantile",
        "window",
        "creep",
        "tail",
    ]
    assert plan.layout("short").planned_blocks == 9
    assert any(
        n.startswith("short: 300 planned requests per engine in 9 blocks of about 33 requests")
        for n in plan.notes
    )
    assert any("can detect TTFT p50 +" in n for n in plan.notes)
    assert math.fsum(c.alpha for c in plan.latency) == pytest.approx(
        Policy().group_alpha("latency")
    )
    assert len({c.alpha for c in plan.latency}) == 1 and len(plan.latency) == 16
    assert math.fsum(c.alpha for c in plan.tails) == pytest.approx(Policy().group_alpha("tail"))
    assert plan.error_alpha == pytest.approx(Policy().group_alpha("errors") / 2)
    with pytest.raises(ValueError, match="planned requests"):
        Plan.build(Policy(), {"x": 0})


def test_the_plan_says_what_size_detect_needs() -> None:
    """The plan names the size that detects a `detect` regression with 80% power; planned at
    that size it says so. The size it names does detect +10% with about the power it
    promises (at least 68% of 80 seeded gates, so a true 80% passes with a wide margin), on
    the noise it assumed (independent pairs, log-ratio sd 0.3)."""
    policy = Policy(detect={"ttft.p50": 0.10})
    small = Plan.build(policy, {"steady": 300})
    need = int(next(n for n in small.notes if "needs" in n).split("needs ")[1].split()[0])
    assert "raise requests to" in " ".join(small.notes)
    big = Plan.build(policy, {"steady": need})
    assert "(planned)" in " ".join(big.notes)
    rng = np.random.default_rng(7)
    held, runs = 0, 80
    for _ in range(runs):
        ref = 100.0 * np.exp(rng.normal(0.0, 0.3 / math.sqrt(2), need))
        cand = 110.0 * np.exp(rng.normal(0.0, 0.3 / math.sqrt(2), need))
        v = judge([ScenarioSamples("steady", arm(ref), arm(cand))], ENGINES, policy, plan=big)
        held += any(c.id == "steady.ttft.p50" and c.decision == "fail" for c in v.checks)
    assert held >= runs * 0.68, held


def test_the_plan_names_a_size_for_detect() -> None:
    """The plan's arithmetic for `detect` (what test_the_plan_says_what_size_detect_needs
    checks against simulation): too small a plan is told to raise its requests, and the size
    it names is planned."""
    policy = Policy(detect={"ttft.p50": 0.10})
    small = Plan.build(policy, {"steady": 300})
    need = int(next(n for n in small.notes if "needs" in n).split("needs ")[1].split()[0])
    assert need > 300 and f"raise requests to {need}" in " ".join(small.notes)
    assert f"needs {need} per engine (planned)" in " ".join(
        Plan.build(policy, {"steady": need}).notes
    )
    unreachable = Plan.build(Policy(detect={"ttft.p50": 0.05}), {"steady": 300})
    assert "TTFT p50 +5% cannot be detected above its tolerance" in " ".join(unreachable.notes)


def test_a_big_regression_stops_the_scenario_early() -> None:
    """A candidate 1.5x slower is held long before the planned 10,000 requests. Judge v3 cuts
    the plan into 32 blocks of about 312 requests and a look tests nothing before
    MIN_TEST_BLOCKS complete blocks, and it spends little alpha early (alpha x t^2), so the
    first hold comes at a fifth of the plan (judge v2, with blocks of 32, stopped by 1,000)."""
    plan = Plan.build(Policy(), {"steady": 10_000})
    per = plan.layout("steady").per_block()
    sj = SequentialJudge(plan)
    ref, cand = stream(1, 10_000), stream(2, 10_000, scale=1.5)
    stopped = None
    for t in range(500, 10_001, 500):
        look = sj.look("steady", arm(ref[:t]), arm(cand[:t]))
        if t < MIN_TEST_BLOCKS * per:
            assert all(c.decision == "undecided" for c in look.checks if c.group == "latency"), t
        if look.stop:
            stopped = (t, look)
            break
    assert stopped is not None
    t, look = stopped
    assert t <= 2_000
    assert look.hold and not look.at_limit
    failed = {c.id for c in look.checks if c.decision == "fail"}
    assert "steady.ttft.p50" in failed
    assert failed <= look.decided


def test_a_clean_scenario_stops_early_once_every_check_passes() -> None:
    """Judge v3 decides both ways: a check passes when its upper bound (at the look's beta)
    is below its threshold, and the errors check passes before the end when the errors give
    no evidence and the candidate's failed share is within error_tolerance. A clean scenario
    whose checks all pass stops before its planned size, with a continue."""
    plan = Plan.build(Policy(), {"steady": 4_000})
    sj = SequentialJudge(plan)
    ref, cand = stream(3, 4_000), stream(4, 4_000)
    look = sj.look("steady", arm(ref[:1_000]), arm(cand[:1_000]))
    errors = next(c for c in look.checks if c.id == "steady.errors")
    assert errors.decision == "pass" and "steady.errors" in look.decided
    assert "within the 1.00% tolerance" in errors.message
    assert not look.stop and look.undecided, "latency is not all shown yet at a quarter"
    stopped = None
    for t in range(1_500, 4_001, 500):
        look = sj.look("steady", arm(ref[:t]), arm(cand[:t]))
        if look.stop:
            stopped = t
            break
    assert stopped is not None and stopped < 4_000
    assert look.all_decided and not look.hold and not look.past_plan
    assert all(c.decision == "pass" for c in look.checks)
    final = sj.look("steady", arm(ref), arm(cand))
    # No check is required, so the plan allows no extension: the planned size is the end.
    assert final.past_plan and final.all_decided and final.stop
    assert not final.extending and final.at_limit and final.limit == 4_000
    assert not final.hold
    assert Plan.build(Policy(require=["p50"]), {"steady": 4_000}).limit("steady") == 6_000


def errors_arm(ttft: np.ndarray, failed: np.ndarray, rate: float = 20.0) -> ArmSamples:
    """An arm of len(ttft) requests sent at `rate` per second whose requests `failed` (ids)
    timed out; the others' TTFT is `ttft` (ids given, so pairs join by schedule id)."""
    n = int(ttft.size)
    failed = np.asarray(failed, np.int64)
    ok = np.setdiff1d(np.arange(n), failed)
    return ArmSamples(
        requests=n,
        ttft_ms=ttft[ok],
        itl_ms=ttft[ok] / 10.0,
        ids={"ttft": ok, "itl": ok},
        errors={"timeout": int(failed.size)} if failed.size else {},
        error_offsets_s=failed / rate,
        error_kinds=("timeout",) * int(failed.size),
        error_ids=failed,
    )


def test_errors_pass_early_only_within_error_tolerance() -> None:
    """Before the planned end the errors check passes when the errors give no evidence and the
    candidate fails at most error_tolerance more of its requests than the reference; a burst
    of 15 timeouts in 1,000 requests (one episode: no evidence, but 1.5 points more) is not
    yet decided, and it holds nothing."""
    policy = Policy(max_error_rate=0.05)
    plan = Plan.build(policy, {"steady": 4_000})
    sj = SequentialJudge(plan)
    ref_t, cand_t = stream(31, 1_000), stream(32, 1_000)
    ref = errors_arm(ref_t, np.array([], np.int64))
    small = sj.look("steady", ref, errors_arm(cand_t, np.arange(500, 505)))
    check = next(c for c in small.checks if c.id == "steady.errors")
    assert check.decision == "pass", check.message
    assert "+0.50% of its requests against the reference" in check.message
    burst = sj.look("steady", ref, errors_arm(cand_t, np.arange(500, 515)))
    check = next(c for c in burst.checks if c.id == "steady.errors")
    assert check.decision == "undecided" and not burst.hold, check.message
    assert "not yet shown within tolerance" in check.message
    assert "steady.errors" in burst.undecided and not burst.stop
    looser = Plan.build(Policy(max_error_rate=0.05, error_tolerance=0.02), {"steady": 4_000})
    again = SequentialJudge(looser).look("steady", ref, errors_arm(cand_t, np.arange(500, 515)))
    assert next(c for c in again.checks if c.id == "steady.errors").decision == "pass"


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
    """What makes the looks free: the blocks and the looks come from the plan, never from the
    look. A look between two planned sizes judges the last planned prefix (2,345 requests
    are judged as the look at 2,000), and its checks use the plan's blocks: the same prefix
    judged once at its end (a plan of its own size) is cut into other blocks."""
    plan = Plan.build(Policy(), {"steady": 8_000})
    assert plan.layout("steady").per_block() == 250
    ref, cand = stream(21, 2_345), stream(22, 2_345)
    sj = SequentialJudge(plan)
    at = sj.look("steady", arm(ref[:2_000]), arm(cand[:2_000]))
    between = sj.look("steady", arm(ref), arm(cand))
    latency = [c for c in at.checks if c.group == "latency"]
    assert latency
    for c, d in zip(latency, [c for c in between.checks if c.group == "latency"], strict=True):
        assert (c.id, c.decision, c.interval, c.ratio) == (d.id, d.decision, d.interval, d.ratio)
        assert c.block_requests == d.block_requests == 250
    once = judge(
        [ScenarioSamples("steady", arm(ref[:2_000]), arm(cand[:2_000]))], ENGINES, Policy()
    )
    p50 = next(c for c in once.checks if c.id == "steady.ttft.p50")
    # Planned at 2,000 the same prefix is 32 blocks of about 62 requests: a look is not a plan.
    assert p50.block_requests == round(Layout.build(2_000).per_block()) == 62
    assert p50.interval != next(c for c in latency if c.id == "steady.ttft.p50").interval


@pytest.mark.parametrize(
    ("sigma", "batch_sigma", "drift", "seed"),
    [(0.3, 0.1, 0.05, 1), (0.6, 0.15, 0.1, 2)],
)
def test_aa_over_many_looks_never_exceeds_alpha(
    sigma: float, batch_sigma: float, drift: float, seed: int
) -> None:
    """A/A gates with batch effects and a drift both arms share, looked at every 500 requests
    up to 3,000 and stopped on the first failure (or when every check is decided): the
    fraction that ever failed a latency or tail check stays within those budgets, however
    often the gate looks (the plan spends each check's alpha over its looks)."""
    policy = Policy(metrics=["ttft"])
    limit, runs = 3_000, 20
    plan = Plan.build(policy, {"steady": limit})
    budget = policy.group_alpha("latency") + policy.group_alpha("tail")
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
        for t in range(policy.look_every, limit + 1, policy.look_every):
            look = sj.look("steady", arm(ref[:t]), arm(cand[:t]))
            if any(c.decision == "fail" for c in look.checks if c.group == "latency"):
                failures += 1
                break
            if look.stop:
                break
    assert failures <= binom.ppf(0.999, runs, budget)


def test_the_plan_extends_only_what_may_run_on() -> None:
    policy = Policy(extend=0.5, require=["ttft.p50"])
    # c is too short to decide anything (one block): allowed here so the plan can be built.
    plan = Plan.build(
        policy, {"a": 1_000, "b": 1_001, "c": 7}, extendable={"a", "b"}, short_ok={"c"}
    )
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
    # Judge v3: errors without evidence and within error_tolerance pass at any look, so they
    # are decided while extending; only the undecided latency keeps the scenario running.
    assert "steady.errors" in at_plan.decided
    assert all(
        c.startswith("steady.ttft.") or c.startswith("steady.itl.") for c in at_plan.undecided
    )
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
