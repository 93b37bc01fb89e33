"""Engine facts: restarts and OOM hold like crashes; startup phases by rule or by test."""

from __future__ import annotations

import numpy as np
import pytest

from gate.analysis.engines import crash_checks, startup_checks
from gate.analysis.judge import judge
from gate.analysis.policy import Policy
from gate.analysis.types import ArmSamples, EngineFacts, ScenarioSamples

POLICY = Policy()


def test_restart_and_oom_hold() -> None:
    checks = crash_checks(
        [
            EngineFacts("reference", 60.0),
            EngineFacts("candidate", 61.0, oom=True, restarts=2),
        ]
    )
    ref, cand = checks
    assert ref.decision == "pass"
    assert cand.decision == "fail" and cand.group == "crash"
    assert "ran out of memory and restarted 2 times" in cand.message
    (void,) = crash_checks([EngineFacts("reference", 60.0, restarts=1)])
    assert void.decision == "fail" and "void" in void.message
    with pytest.raises(ValueError, match="restarts"):
        EngineFacts("candidate", 1.0, restarts=-1)


def test_single_launch_phases_follow_the_rule() -> None:
    notes: list[str] = []
    checks = startup_checks(
        [
            EngineFacts("reference", 60.0, phases={"load_weights": 30.0, "cuda_graphs": 10.0}),
            EngineFacts(
                "candidate",
                70.0,
                phases={"load_weights": 31.0, "cuda_graphs": 25.0, "compile": 4.0},
            ),
        ],
        POLICY,
        notes,
    )
    by_id = {c.id: c for c in checks}
    assert by_id["startup.ready"].decision == "pass"
    assert by_id["startup.phase.load_weights"].decision == "pass"
    cg = by_id["startup.phase.cuda_graphs"]
    # 25 s against 1.5 x 10 + 2 = 17 s.
    assert cg.decision == "fail" and cg.threshold == pytest.approx(17.0)
    assert "one launch each: a rule, not a test" in cg.message
    assert cg.alpha is None
    assert any("compile" in n and "one engine only" in n for n in notes)


def test_repeated_launches_are_tested() -> None:
    ref = EngineFacts("reference", 60.0, phases={"load_weights": [30.0, 31.0, 29.5, 30.5]})
    slow = EngineFacts("candidate", 60.0, phases={"load_weights": [52.0, 53.0, 51.5, 52.5]})
    noisy = EngineFacts("candidate", 60.0, phases={"load_weights": [20.0, 80.0, 30.0, 60.0]})
    fine = EngineFacts("candidate", 60.0, phases={"load_weights": [31.0, 30.0, 32.0, 29.0]})
    decide = {
        name: startup_checks([ref, e], POLICY, [])[1]
        for name, e in (("slow", slow), ("noisy", noisy), ("fine", fine))
    }
    assert decide["slow"].decision == "fail"
    assert decide["slow"].alpha == pytest.approx(POLICY.group_alpha("startup"))
    assert decide["slow"].samples == (4, 4)
    assert decide["noisy"].decision == "undecided"
    assert "more launches" in decide["noisy"].message
    assert decide["fine"].decision == "pass"
    # One launch on one side: the rule, on the other side's median.
    mixed = startup_checks(
        [ref, EngineFacts("candidate", 60.0, phases={"load_weights": 40.0})], POLICY, []
    )[1]
    assert mixed.alpha is None and mixed.decision == "pass"
    with pytest.raises(ValueError, match="durations"):
        EngineFacts("candidate", 1.0, phases={"x": []})


def test_a_phase_named_ready_does_not_clash_with_the_overall_check() -> None:
    phases = {"launched": 0.0, "port_open": 0.4, "ready": 0.3}
    facts = [
        EngineFacts(role="reference", ready_s=1.0, phases=phases),
        EngineFacts(role="candidate", ready_s=1.0, phases=phases),
    ]
    rng = np.random.default_rng(0)
    arm = ArmSamples(
        requests=300, ttft_ms=rng.lognormal(3, 0.05, 300), itl_ms=rng.lognormal(2, 0.05, 300)
    )
    verdict = judge([ScenarioSamples("s", arm, arm)], facts, Policy())
    ids = [c.id for c in verdict.checks]
    assert len(ids) == len(set(ids))
    assert "startup.ready" in ids and "startup.phase.ready" in ids
