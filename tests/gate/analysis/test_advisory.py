"""policy.advisory, pure: which checks a pattern marks, that a marked check never holds nor
stops a scenario, and which patterns are refused (argoproj/argo-rollouts
utils/analysis/helpers.go `GetDryRunMetrics`: a dry-run rule matching no metric is an error)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gate.analysis.advisory import mark_advisory, unmatched
from gate.analysis.checks import ratio_check, rule_check
from gate.analysis.policy import Policy
from gate.analysis.sequential import Look
from gate.analysis.types import Check, Verdict

SCENARIOS = ["steady", "peak.1", "overload"]
# one id of every family the judge builds (judge.py and the modules it calls)
IDS = [
    "steady.ttft.p50",
    "steady.itl.p90",
    "steady.ttft.tail",
    "steady.itl.window",
    "steady.ttft.creep",
    "steady.errors",
    "steady.errors.timeout",
    "steady.errors.other",
    "steady.outputs",
    "steady.outputs.divergence",
    "steady.saturation.candidate",
    "peak.1.goodput",
    "overload.overload",
    "overload.recovery",
    "steady.capacity",
    "steady.engine.preemptions",
    "engine.kv_capacity",
    "startup.ready",
    "startup.phase.weights_loaded",
    "startup.phase.decode.healthy",
    "crash.candidate",
    "crash.reference.2",
    "compat.tool_calls",
    "compat.capability.logprobs",
    "correctness.teacher.kl",
    "correctness.greedy.position",
    "correctness.answered",
]


def _latency(cid: str, decision: str = "fail") -> Check:
    scenario, metric, what = cid.split(".")
    q = float(what[1:]) / 100.0 if what.startswith("p") else None
    return ratio_check(
        cid, metric, decision, "m", scenario=scenario, threshold=1.1, samples=(9, 9), quantile=q
    )  # type: ignore[arg-type]


def test_every_family_of_check_ids_can_be_named() -> None:
    assert unmatched(IDS, Policy(), SCENARIOS) == []
    wide = ["*", "*.ttft.*", "startup.*", "compat.capability.*"]
    assert unmatched(wide, Policy(), SCENARIOS) == []


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("stedy.ttft.p90", "matches no check"),
        ("steady.ttft.p95", "matches no check"),  # the policy checks p50 and p90
        ("steady.e2e.p50", "matches no check"),  # e2e is not judged by default
        ("crash.candidate.x.y", "matches no check"),
        ("gate.environment", "never advisory"),
        ("latency.coverage", "never advisory"),
    ],
)
def test_a_pattern_that_matches_no_check_is_refused(pattern: str, why: str) -> None:
    (found,) = unmatched([pattern], Policy(), SCENARIOS)
    assert found[0] == 0 and why in found[1]


def test_policy_names_the_entry_and_spelling() -> None:
    with pytest.raises(ValidationError, match=r"advisory\[1\]: 'crash\.sometimes'"):
        Policy(advisory=["tail", "crash.sometimes"])
    with pytest.raises(ValidationError, match="not a check pattern"):
        Policy(advisory=["steady ttft"])
    with pytest.raises(ValidationError, match=r"advisory: 'e2e\.p50' names metric"):
        Policy(advisory=["e2e.p50"])


def test_an_advisory_failure_never_holds_and_is_listed_apart() -> None:
    policy = Policy(advisory=["p90", "startup.*"])
    checks = mark_advisory(
        [
            _latency("steady.ttft.p90"),
            _latency("steady.ttft.p50", "pass"),
            rule_check("startup.ready", "startup", "ready", "undecided", "no time"),
            rule_check("crash.candidate", "crash", "crashed", "pass", "fine"),
        ],
        policy,
    )
    assert [c.advisory for c in checks] == [True, False, True, False]
    assert not any(c.holds for c in checks)
    verdict = Verdict("continue", tuple(checks), (), ())
    assert [c.id for c in verdict.advisory] == ["steady.ttft.p90", "startup.ready"]
    assert verdict.not_shown == () and verdict.warnings == ()
    # a look does not stop the scenario on an advisory failure (IsTerminating skips DryRun)
    look = Look("steady", (9, 9), 9, (checks[0],), frozenset(), ())
    assert not look.hold
    plain = mark_advisory([_latency("steady.ttft.p90")], Policy())
    assert plain[0].holds and Look("steady", (9, 9), 9, tuple(plain), frozenset(), ()).hold
