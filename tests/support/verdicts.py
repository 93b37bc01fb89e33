"""Verdicts every surface's tests show: one failed check, one undecided check that is not
required (what a continue could not show), two checks in the warning tier, and passes; as the
judge's Verdict and as the document a finished gate stores. Issue 28 item 6: each surface must
say the same thing about them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gate.analysis.checks import ratio_check, rule_check, statistic_check
from gate.analysis.types import Check, Verdict
from gate.verdict import Evidence, Header, VerdictDocument, gate_document
from gate.verdict.document import EngineDoc

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

FAILED = ratio_check(
    "steady.ttft.p50",
    "ttft",
    "fail",
    "TTFT p50 in steady is 1.43x the reference, request for request (interval 1.41x-1.45x), "
    "above the 1.05x threshold.",
    scenario="steady",
    quantile=0.5,
    reference=40.0,
    candidate=57.2,
    ratio=1.43,
    interval=(1.41, 1.45),
    threshold=1.05,
    samples=(500, 500),
    alpha=0.004,
)
NOT_SHOWN = ratio_check(
    "steady.ttft.p90",
    "ttft",
    "undecided",
    "TTFT p90 in steady is undecided: 1.04x the reference, and the interval 0.98x-1.14x "
    "includes the 1.10x threshold: no regression was shown, and at this size the gate could "
    "detect p90 >= +22%.",
    scenario="steady",
    quantile=0.9,
    reference=80.0,
    candidate=83.2,
    ratio=1.04,
    interval=(0.98, 1.14),
    threshold=1.10,
    samples=(200, 200),
    alpha=0.004,
    required=False,
    detectable=1.22,
)
SLOWER = replace(
    ratio_check(
        "steady.itl.p50",
        "itl",
        "pass",
        "ITL p50 in steady is within tolerance: at most 1.08x the reference (threshold 1.10x).",
        scenario="steady",
        quantile=0.5,
        reference=10.0,
        candidate=10.66,
        ratio=1.066,
        interval=(1.05, 1.08),
        threshold=1.10,
        samples=(200, 200),
        alpha=0.004,
    ),
    warning="ITL p50 in steady is 6.6% slower (1.066x), past the 1.05x warning threshold.",
)
ERRORS = replace(
    statistic_check(
        "steady.errors",
        "errors",
        "errors",
        "pass",
        "Both engines failed 2.4% of requests; the candidate's rate is not above the reference's.",
        scenario="steady",
        reference=0.024,
        candidate=0.024,
        threshold=0.01,
        samples=(292, 292),
        alpha=0.002,
    ),
    warning="Both engines failed 2.4% of requests, above the 1.00% ceiling, not with "
    "confidence at 292 requests.",
)
CRASH = rule_check("crash.candidate", "crash", "crash", "pass", "The candidate did not crash.")

CONTINUE_LINE = (
    "continue, with 2 warnings; not shown: TTFT p90 in steady within +10% (shown: at most +14%)"
)
HOLD_LINE = "hold: 1 check failed (steady.ttft.p50)"


def mixed_verdict(hold: bool) -> Verdict:
    """hold: the failed check with the others (a hold); else the others alone (a continue
    with 2 warnings and 1 check not shown)."""
    checks: tuple[Check, ...] = (NOT_SHOWN, SLOWER, ERRORS, CRASH)
    if hold:
        return Verdict("hold", (FAILED, *checks), (FAILED,), ("judge note",))
    return Verdict("continue", checks, (), ("judge note",))


def mixed_document(hold: bool, gate_id: str = "g-mixed") -> VerdictDocument:
    """The document a finished gate of `mixed_verdict` stores."""
    header = Header(
        gate_id=gate_id,
        name="mixed",
        model="demo-model",
        report=f"/r/mixed-{gate_id}.html",
        document=f"/r/mixed-{gate_id}.json",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=12),
        duration_s=12.0,
    )
    engines = {
        role: EngineDoc(kind="endpoint", url=f"http://127.0.0.1:{port}", phases={"ready": 0.2})
        for role, port in (("reference", 8001), ("candidate", 8002))
    }
    evidence = Evidence(engines=engines)  # type: ignore[arg-type]
    return gate_document(header, "complete", mixed_verdict(hold), None, evidence)


def old_document() -> dict[str, Any]:
    """A continue stored before 'undecided' and the summary: its undecided check says
    'inconclusive', and it has no summary, warnings or not_shown keys."""
    data = mixed_document(hold=False, gate_id="g-old").to_json()
    for key in ("summary", "warnings", "not_shown"):
        del data[key]
    for check in data["checks"]:
        check.pop("warning", None)
        if check["decision"] == "undecided":
            check["decision"] = "inconclusive"
    return data
