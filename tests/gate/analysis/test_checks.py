"""The Check constructors fill what they are given, leave the rest None, and build plain Checks."""

from __future__ import annotations

import math
from dataclasses import fields

from gate.analysis.checks import quotient, ratio_check, rule_check, statistic_check
from gate.analysis.types import Check

STATS = ("quantile", "reference", "candidate", "ratio", "interval", "threshold", "alpha")
PAIRED = ("detectable", "correlation_requests", "block_requests")  # paired latency checks only
# Check.warning (the warning tier): None unless a site sets it; no constructor takes it.
WARNING = ("warning",)


def unset(check: Check) -> set[str]:
    return {f.name for f in fields(check) if getattr(check, f.name) is None}


def test_rule_check_leaves_every_statistic_none() -> None:
    check = rule_check("crash.candidate", "crash", "crashed", "fail", "It crashed.")
    assert (check.id, check.group, check.metric) == ("crash.candidate", "crash", "crashed")
    assert (check.decision, check.message, check.samples) == ("fail", "It crashed.", (0, 0))
    assert unset(check) == {"scenario", "estimate_interval", *STATS, *PAIRED, *WARNING}
    assert check.required and check.holds


def test_rule_check_fills_the_observed_values() -> None:
    check = rule_check(
        "compat.probe",
        "compatibility",
        "probe",
        "pass",
        "Same.",
        reference=200.0,
        candidate=200.0,
        samples=(1, 1),
    )
    assert (check.reference, check.candidate, check.samples) == (200.0, 200.0, (1, 1))
    assert unset(check) == {
        "scenario",
        "quantile",
        "ratio",
        "interval",
        "threshold",
        "alpha",
        "estimate_interval",
        *PAIRED,
        *WARNING,
    }


def test_statistic_check_fills_interval_and_alpha() -> None:
    check = statistic_check(
        "peak.goodput",
        "peak",
        "goodput",
        "pass",
        "Fine.",
        scenario="peak",
        reference=0.9,
        candidate=0.8,
        ratio=quotient(0.9, 0.8),
        interval=(-0.02, 0.01),
        threshold=-0.05,
        samples=(100, 100),
        alpha=0.01,
    )
    assert check.ratio is not None and math.isclose(check.ratio, 0.8 / 0.9)
    assert (check.interval, check.threshold, check.alpha) == ((-0.02, 0.01), -0.05, 0.01)
    assert unset(check) == {"quantile", "estimate_interval", *PAIRED, *WARNING}
    bare = statistic_check("s.errors", "errors", "errors", "undecided", "Empty.")
    assert unset(bare) == {"scenario", "estimate_interval", *STATS, *PAIRED, *WARNING}
    assert bare.holds, "an undecided error check holds: it is required"


def test_ratio_check_is_latency_and_leaves_missing_estimates_none() -> None:
    check = ratio_check(
        "s.ttft.p99",
        "ttft",
        "undecided",
        "No samples.",
        scenario="s",
        quantile=0.99,
        threshold=1.1,
        samples=(0, 5),
    )
    assert (check.group, check.scenario, check.quantile, check.threshold) == (
        "latency",
        "s",
        0.99,
        1.1,
    )
    assert unset(check) == {
        "reference",
        "candidate",
        "ratio",
        "interval",
        "alpha",
        "estimate_interval",
        *PAIRED,
        *WARNING,
    }
    assert check.holds, "required by default: the paired checks set it from the policy"
    optional = ratio_check(
        "s.ttft.p90",
        "ttft",
        "undecided",
        "Undecided.",
        scenario="s",
        threshold=1.1,
        samples=(5, 5),
        required=False,
    )
    assert not optional.holds
    assert ratio_check(
        "s.ttft.p90",
        "ttft",
        "fail",
        "Slower.",
        scenario="s",
        threshold=1.1,
        samples=(5, 5),
        required=False,
    ).holds, "a failed check holds whether or not it is required"


def test_quotient_needs_both_values_and_a_nonzero_reference() -> None:
    assert quotient(2.0, 1.0) == 0.5
    assert quotient(0.0, 1.0) is None
    assert quotient(None, 1.0) is None
    assert quotient(1.0, None) is None


def test_helper_built_checks_equal_the_ones_spelled_out_in_full() -> None:
    full = Check(
        id="s.ttft.p99",
        group="latency",
        scenario="s",
        metric="ttft",
        quantile=0.99,
        reference=100.0,
        candidate=math.nan,
        ratio=math.inf,
        interval=(0.9, math.inf),
        threshold=1.1,
        decision="undecided",
        samples=(50, 60),
        alpha=0.002,
        message="Undecided.",
        estimate_interval=(0.95, 1.2),
    )
    built = ratio_check(
        "s.ttft.p99",
        "ttft",
        "undecided",
        "Undecided.",
        scenario="s",
        quantile=0.99,
        reference=100.0,
        candidate=math.nan,
        ratio=math.inf,
        interval=(0.9, math.inf),
        threshold=1.1,
        samples=(50, 60),
        alpha=0.002,
        estimate_interval=(0.95, 1.2),
    )
    assert built.to_dict() == full.to_dict()

    full_rule = Check(
        id="s.outputs",
        group="correctness",
        scenario="s",
        metric="outputs",
        quantile=None,
        reference=0.0,
        candidate=3.0,
        ratio=None,
        interval=None,
        threshold=0.0,
        decision="fail",
        samples=(10, 10),
        alpha=None,
        message="Broken.",
    )
    built_rule = rule_check(
        "s.outputs",
        "correctness",
        "outputs",
        "fail",
        "Broken.",
        scenario="s",
        reference=0.0,
        candidate=3.0,
        threshold=0.0,
        samples=(10, 10),
    )
    assert built_rule == full_rule
    assert built_rule.to_dict() == full_rule.to_dict()

    full_test = Check(
        id="s.errors",
        group="errors",
        scenario="s",
        metric="errors",
        quantile=None,
        reference=0.01,
        candidate=0.02,
        ratio=2.0,
        interval=None,
        threshold=0.05,
        decision="pass",
        samples=(100, 100),
        alpha=0.01,
        message="Fine.",
    )
    built_test = statistic_check(
        "s.errors",
        "errors",
        "errors",
        "pass",
        "Fine.",
        scenario="s",
        reference=0.01,
        candidate=0.02,
        ratio=quotient(0.01, 0.02),
        threshold=0.05,
        samples=(100, 100),
        alpha=0.01,
    )
    assert built_test == full_test
    assert built_test.to_dict() == full_test.to_dict()


def test_a_warning_is_in_the_dict_and_in_the_verdicts_warning_tier() -> None:
    """Check.warning (judge v3): a check that does not hold but that a continue must mention.
    to_dict always carries the "warning" key (None when unset); a Verdict lists a check in
    `warnings` only when it has a warning and does not hold, and an undecided check that is
    not required is in `not_shown`."""
    from dataclasses import replace

    from gate.analysis.types import Verdict

    plain = ratio_check(
        "s.ttft.p90",
        "ttft",
        "undecided",
        "Undecided.",
        scenario="s",
        threshold=1.1,
        samples=(5, 5),
        required=False,
    )
    assert plain.to_dict()["warning"] is None
    warned = replace(plain, warning="s.ttft.p90 is 1.30x the reference, past its 1.10x")
    assert warned.to_dict()["warning"] == "s.ttft.p90 is 1.30x the reference, past its 1.10x"
    assert not warned.holds and warned.not_shown
    held = replace(warned, id="s.ttft.p50", decision="fail")
    verdict = Verdict("hold", (plain, warned, held), (held,), ())
    assert [c.id for c in verdict.warnings] == [warned.id] and warned in verdict.warnings
    assert held not in verdict.warnings, "a check that holds is a reason, not a warning"
    assert verdict.not_shown == (plain, warned)
    d = verdict.to_dict()
    assert [c["warning"] for c in d["warnings"]] == [warned.warning]
    assert len(d["not_shown"]) == 2
