"""Numerical divergence: the statistics by hand, hard rules, and envelope tests that pass benign
noise and hold real bugs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate.analysis.calibration_sim import SimConfig, _divergence
from gate.analysis.divergence import (
    DivergenceSamples,
    GreedyPair,
    GreedyRun,
    Scored,
    TeacherForcedPair,
    divergence_checks,
    greedy_stats,
    teacher_stats,
)
from gate.analysis.judge import judge
from gate.analysis.policy import Policy
from gate.analysis.types import EngineFacts

POLICY = Policy()
L2 = math.log(0.5)
L4 = math.log(0.25)


def test_teacher_stats_by_hand() -> None:
    a = Scored([L2, L2], [{1: L2, 2: L4, 3: L4}, {5: L2, 6: L4}])
    b = Scored([L4, L2], [{2: L2, 1: L4, 3: L4}, {5: L2, 6: L4}])
    s = teacher_stats(TeacherForcedPair([1, 5], a, b), k=2)
    assert s.mean_abs_dlogp == pytest.approx(abs(L2 - L4) / 2)
    assert s.max_abs_dlogp == pytest.approx(abs(L2 - L4))
    assert s.top1_disagree == 0.5
    assert s.topk_overlap == 1.0
    # Position 0: buckets {1, 2} + other: a = (.5, .25, .25), b = (.25, .5, .25).
    kl0 = 0.5 * math.log(2.0) + 0.25 * math.log(0.5)
    assert s.kl == pytest.approx(kl0 / 2)
    assert s.finite


def test_greedy_stats_margin_outside_top_k_runaway_empty() -> None:
    top = [{1: L2, 2: math.log(0.3)}, {3: L2, 4: L4}]
    ref = GreedyRun([1, 3], [L2, L2], top)
    near = GreedyRun([2, 3], [math.log(0.3), L2], top)
    s = greedy_stats(GreedyPair(ref, near), k=2, runaway_factor=1.5)
    assert s.first_divergence == 0 and not s.exact
    assert s.margin == pytest.approx(L2 - math.log(0.3))
    far = GreedyRun([9, 3], [L4, L2], top)
    assert greedy_stats(GreedyPair(ref, far), 2, 1.5).outside_top_k
    assert greedy_stats(GreedyPair(ref, ref), 2, 1.5).exact
    long = GreedyRun([1, 3] + [7] * 30, [L2] * 32, top + [{7: 0.0}] * 30)
    assert greedy_stats(GreedyPair(ref, long), 2, 1.5).runaway
    capped = GreedyRun([1, 3, 3], [L2] * 3, [*top, {3: 0.0}], max_tokens=2)
    assert greedy_stats(GreedyPair(ref, capped), 2, 1.5).runaway
    empty = GreedyRun([], [], [])
    assert greedy_stats(GreedyPair(ref, empty), 2, 1.5).empty


def sim(kind: str, seed: int = 0, prompts: int = 48) -> DivergenceSamples:
    config = SimConfig(prompts=prompts)
    return _divergence(np.random.default_rng(seed), config, kind, POLICY.divergence.top_k)  # type: ignore[arg-type]


def decisions(data: DivergenceSamples, policy: Policy = POLICY) -> dict[str, str]:
    return {c.id: c.decision for c in divergence_checks(data, policy, [])}


@pytest.mark.parametrize("kind", ["same", "benign"])
def test_benign_noise_passes(kind: str) -> None:
    got = decisions(sim(kind, seed=1))
    assert set(got) == {
        "correctness.finite",
        "correctness.empty",
        "correctness.length",
        "correctness.greedy.flips",
        "correctness.greedy.margin",
        "correctness.teacher.logprob",
        "correctness.teacher.top1",
        "correctness.teacher.kl",
        "correctness.greedy.position",
    }
    assert set(got.values()) == {"pass"}, got


def test_a_numerical_bug_holds() -> None:
    data = sim("bug", seed=2)
    checks = {c.id: c for c in divergence_checks(data, POLICY, [])}
    assert checks["correctness.teacher.kl"].decision == "fail"
    assert checks["correctness.greedy.margin"].decision == "fail"
    assert "more than noise explains" in checks["correctness.greedy.margin"].message
    assert all(c.group == "correctness" for c in checks.values())
    tested = [c.alpha for c in checks.values() if c.alpha is not None]
    assert sum(tested) == pytest.approx(POLICY.group_alpha("correctness"))


def test_nan_logprob_is_a_hard_failure() -> None:
    data = sim("same", seed=3, prompts=8)
    bad = data.teacher[0]
    broken = TeacherForcedPair(
        bad.token_ids, bad.a, Scored([math.nan, *bad.b.logprobs[1:]], bad.b.top)
    )
    data = DivergenceSamples(
        [broken, *data.teacher[1:]], data.greedy, data.envelope_teacher, data.envelope_greedy
    )
    assert decisions(data)["correctness.finite"] == "fail"


def test_without_envelope_or_budget_or_prompts_the_tests_are_inconclusive() -> None:
    data = sim("same", seed=4, prompts=20)
    no_env = DivergenceSamples(data.teacher, data.greedy)
    got = decisions(no_env)
    assert got["correctness.teacher.logprob"] == "undecided"
    assert got["correctness.finite"] == "pass"
    zero = Policy(alpha_split={"latency": 0.5, "errors": 0.5, "correctness": 0.0})
    assert decisions(data, zero)["correctness.teacher.kl"] == "undecided"
    few = sim("same", seed=5, prompts=3)
    assert decisions(few)["correctness.teacher.top1"] == "undecided"


def test_divergence_through_the_judge() -> None:
    engines = (EngineFacts("reference", 60.0), EngineFacts("candidate", 60.0))
    verdict = judge([], engines, POLICY, divergence=sim("bug", seed=6))
    assert verdict.decision == "hold"
    assert verdict.reasons[0].group == "correctness"
    assert verdict.reasons[0].decision == "fail"


def test_flip_outside_the_reference_top_k_is_a_hard_failure() -> None:
    # the reference lists its top-5 at the first position: token 9 is not among them
    five = {1: L2, 2: math.log(0.3), 5: math.log(0.1), 6: math.log(0.05), 7: math.log(0.01)}
    top = [five, {3: L2, 4: L4}]
    ref = GreedyRun([1, 3], [L2, L2], top)
    far = GreedyRun([9, 3], [L4, L2], [{9: L4, 1: L2}, *top[1:]])
    data = DivergenceSamples(greedy=[GreedyPair(ref, far)], envelope_greedy=[GreedyPair(ref, ref)])
    checks = {c.id: c for c in divergence_checks(data, POLICY, [])}
    assert checks["correctness.greedy.flips"].decision == "fail"
    assert checks["correctness.greedy.flips"].alpha is None
    assert "outside the reference's top-5" in checks["correctness.greedy.flips"].message
    # Without an envelope a flip at a 0.51-nat margin (above 0.3) is a bug by rule.
    near = GreedyRun([2, 3], [math.log(0.3), L2], top)
    lone = {
        c.id: c
        for c in divergence_checks(DivergenceSamples(greedy=[GreedyPair(ref, near)]), POLICY, [])
    }
    assert lone["correctness.greedy.margin"].decision == "fail"
    assert lone["correctness.greedy.margin"].alpha is None


def test_a_reference_capped_below_top_k_makes_no_flip_a_hard_failure() -> None:
    """A reference that returns one top logprob (an engine's max_logprobs of 1): whether the
    candidate's token is in its top-5 is unknown, so a flip is neither outside nor a margin."""
    ref = GreedyRun([1, 3], [L2, L2], [{1: L2}, {3: L2}])
    other = GreedyRun([2, 3], [L2, L2], [{2: L2}, {3: L2}])
    data = DivergenceSamples(
        greedy=[GreedyPair(ref, other)], envelope_greedy=[GreedyPair(ref, ref)]
    )
    checks = {c.id: c for c in divergence_checks(data, POLICY, [])}
    assert checks["correctness.greedy.flips"].decision == "pass"
    st = greedy_stats(GreedyPair(ref, other), 5, 1.5)
    assert st.first_divergence == 0 and st.margin is None and not st.outside_top_k


def test_undecided_correctness_checks_never_hold() -> None:
    """Lack of evidence (no budget for correctness, or too few prompts for it) leaves the
    tests inconclusive and not required: only a failure holds the gate."""
    data = sim("same", seed=3, prompts=12)
    no_budget = POLICY.model_copy(
        update={"alpha_split": {**POLICY.alpha_split, "latency": 0.55, "correctness": 0.0}}
    )
    checks = divergence_checks(data, no_budget, [])
    undecided = [c for c in checks if c.decision == "undecided"]
    assert undecided and all(not c.required and not c.holds for c in undecided)


def test_unanswered_probes_fail_for_the_candidate_and_void_for_the_reference() -> None:
    data = sim("same", seed=3, prompts=12)
    failed = DivergenceSamples(
        greedy=data.greedy[1:],
        envelope_greedy=data.envelope_greedy,
        teacher=data.teacher,
        envelope_teacher=data.envelope_teacher,
        failures=[("candidate", "HTTP 500: Internal Server Error")],
    )
    checks = {c.id: c for c in divergence_checks(failed, POLICY, [])}
    answered = checks["correctness.answered"]
    assert answered.decision == "fail" and answered.alpha is None
    assert "HTTP 500" in answered.message and "candidate failed 1" in answered.message
    # Every candidate request failed: no pair at all, and still a failing check (not silence).
    only = DivergenceSamples(failures=[("candidate", "HTTP 500")] * 3)
    assert [(c.id, c.decision) for c in divergence_checks(only, POLICY, [])] == [
        ("correctness.answered", "fail")
    ]
    ref_only = DivergenceSamples(failures=[("reference", "no logprobs")])
    assert decisions(ref_only) == {"correctness.answered": "undecided"}
    assert "correctness.answered" not in decisions(data)
