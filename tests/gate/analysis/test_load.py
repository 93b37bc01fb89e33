"""Peak goodput, overload shedding vs collapse, recovery time: pass, fail and the edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate.analysis.judge import judge
from gate.analysis.load import (
    OverloadPhase,
    PeakPhase,
    RequestLog,
    Slo,
    goodput_check,
    overload_check,
    recovery_check,
    recovery_time_s,
)
from gate.analysis.policy import Policy
from gate.analysis.types import ArmSamples, EngineFacts, ScenarioSamples

POLICY = Policy()
ENGINES = (EngineFacts("reference", 60.0), EngineFacts("candidate", 62.0))


def log(
    ttft: np.ndarray,
    *,
    sent: np.ndarray | None = None,
    error: list[str | None] | None = None,
    status: np.ndarray | None = None,
    e2e: np.ndarray | None = None,
) -> RequestLog:
    n = ttft.size
    return RequestLog(
        sent_s=np.arange(n) / 20.0 if sent is None else sent,
        ttft_ms=ttft,
        itl_ms=np.full(n, 20.0),
        e2e_ms=ttft + 600.0 if e2e is None else e2e,
        status=np.full(n, 200) if status is None else status,
        error=[None] * n if error is None else error,
    )


def peak(seed: int, n: int, cand_scale: float) -> PeakPhase:
    rng = np.random.default_rng(seed)
    ref = rng.lognormal(math.log(150.0), 0.3, n)
    cand = rng.lognormal(math.log(150.0), 0.3, n) * cand_scale
    return PeakPhase("peak", log(ref), log(cand), Slo(ttft_ms=250.0, itl_ms=50.0))


def test_goodput_equal_engines_pass() -> None:
    check = goodput_check(peak(1, 4_000, 1.0), POLICY, 0.005, [])
    assert check.decision == "pass", check.message
    assert check.group == "peak" and check.id == "peak.goodput"
    assert check.interval is not None and check.interval[0] > -POLICY.load.goodput_tolerance
    assert "TTFT <= 250 ms and ITL <= 50 ms" in check.message


def test_goodput_loss_fails_with_both_fractions_in_the_message() -> None:
    check = goodput_check(peak(2, 4_000, 1.3), POLICY, 0.005, [])
    assert check.decision == "fail", check.message
    assert check.reference is not None and check.candidate is not None
    assert check.candidate < check.reference - 0.05
    assert "below the allowed loss of 2.0 points" in check.message


def test_goodput_with_few_requests_is_inconclusive() -> None:
    check = goodput_check(peak(3, 60, 1.0), POLICY, 0.005, [])
    assert check.decision == "undecided"
    notes: list[str] = []
    p = peak(3, 100, 1.0)
    uneven = PeakPhase("peak", p.reference, p.candidate.head(90), p.slo)
    goodput_check(uneven, POLICY, 0.005, notes)
    assert any("first 90 pairs" in n for n in notes)


def overload(seed: int, cand: str) -> OverloadPhase:
    """80 s at 20/s: calm until 20 s, overload until 50 s, calm after."""
    rng = np.random.default_rng(seed)
    n = 1_600
    sent = np.arange(n) / 20.0
    during = (sent >= 20.0) & (sent < 50.0)
    base = rng.lognormal(math.log(100.0), 0.2, n)
    ref_err: list[str | None] = [None] * n
    ref_status = np.full(n, 200)
    ref_e2e = base + 500.0
    # The reference sheds half the overload fast with 429s.
    for i in np.flatnonzero(during)[::2]:
        ref_err[i] = "http_4xx"
        ref_status[i] = 429
        ref_e2e[i] = 5.0
    reference = log(base, sent=sent, error=ref_err, status=ref_status, e2e=ref_e2e)
    if cand == "same":
        return OverloadPhase("burst", reference, reference, 20.0, 50.0)
    ttft = base.copy()
    err: list[str | None] = [None] * n
    status = np.full(n, 200)
    e2e = ttft + 500.0
    if cand == "collapse":
        # Queues instead of shedding: TTFT explodes, then requests time out, and it is slow to
        # come back after the overload.
        ttft[during] = 100.0 * np.linspace(1.0, 40.0, during.sum())
        for i in np.flatnonzero(during)[1::3]:
            err[i] = "timeout"
            status[i] = 0
            e2e[i] = 30_000.0
        after = (sent >= 50.0) & (sent < 65.0)
        ttft[after] = 1_500.0
    candidate = log(ttft, sent=sent, error=err, status=status, e2e=e2e)
    return OverloadPhase("burst", reference, candidate, 20.0, 50.0)


def test_shedding_like_the_reference_passes() -> None:
    check = overload_check(overload(1, "same"), POLICY, 0.005, [])
    assert check.decision == "pass", check.message
    assert "shed 50.0%" in check.message


def test_collapse_fails_where_the_reference_sheds() -> None:
    check = overload_check(overload(1, "collapse"), POLICY, 0.005, [])
    assert check.decision == "fail", check.message
    assert check.group == "overload"
    assert check.candidate is not None and check.candidate > 0.5
    assert "collapses" in check.message


def test_a_slow_rejection_is_collapse_not_shedding() -> None:
    o = overload(1, "same")
    slow = RequestLog(
        o.candidate.sent_s,
        o.candidate.ttft_ms,
        o.candidate.itl_ms,
        np.where(o.candidate.status == 429, 5_000.0, o.candidate.e2e_ms),
        o.candidate.status,
        o.candidate.error,
    )
    check = overload_check(OverloadPhase("burst", o.reference, slow, 20.0, 50.0), POLICY, 0.005, [])
    assert check.decision == "fail", check.message


def test_recovery_time_and_rule() -> None:
    same = overload(1, "same")
    t, level = recovery_time_s(same.reference, 20.0, 50.0, 5.0, 0.1)
    assert t == 0.0
    assert level == pytest.approx(100.0, rel=0.05)
    assert recovery_check(same, POLICY).decision == "pass"
    slow = overload(1, "collapse")
    t_c, _ = recovery_time_s(slow.candidate, 20.0, 50.0, 5.0, 0.1)
    assert t_c == pytest.approx(15.0)
    check = recovery_check(slow, POLICY)
    # 15 s against 0 s: above the 1.5 x 0 + 10 s allowance.
    assert check.decision == "fail", check.message
    assert check.group == "recovery" and "15 s after the overload vs 0 s" in check.message


def test_never_recovering_candidate_fails() -> None:
    o = overload(1, "same")
    ttft = np.where(o.candidate.sent_s >= 20.0, 5_000.0, o.candidate.ttft_ms)
    stuck = RequestLog(
        o.candidate.sent_s,
        ttft,
        o.candidate.itl_ms,
        o.candidate.e2e_ms,
        o.candidate.status,
        o.candidate.error,
    )
    check = recovery_check(OverloadPhase("burst", o.reference, stuck, 20.0, 50.0), POLICY)
    assert check.decision == "fail"
    assert "never returned" in check.message


def test_load_phases_through_the_judge_share_the_load_budget() -> None:
    rng = np.random.default_rng(9)
    steady = [
        ArmSamples(800, rng.lognormal(5.0, 0.05, 800), rng.lognormal(3.0, 0.05, 800))
        for _ in range(2)
    ]
    verdict = judge(
        [ScenarioSamples("steady", steady[0], steady[1])],
        ENGINES,
        POLICY,
        peaks=[peak(1, 4_000, 1.0)],
        overloads=[overload(1, "collapse")],
    )
    by_id = {c.id: c for c in verdict.checks}
    assert by_id["peak.goodput"].decision == "pass"
    assert by_id["burst.overload"].decision == "fail"
    assert by_id["burst.recovery"].decision == "fail"
    alphas = [by_id["peak.goodput"].alpha, by_id["burst.overload"].alpha]
    assert sum(a for a in alphas if a is not None) == pytest.approx(POLICY.group_alpha("load"))
    assert verdict.decision == "hold"
    # A spec from before the load group: no budget, no statistical load checks, a note says so.
    old = Policy(alpha_split={"latency": 0.4, "errors": 0.2, "correctness": 0.4})
    verdict = judge([], ENGINES, old, peaks=[peak(1, 100, 1.0)])
    assert "peak.goodput" not in {c.id for c in verdict.checks}
    assert any("no budget" in n for n in verdict.notes)


def test_request_log_validates_columns() -> None:
    with pytest.raises(ValueError, match="one per request"):
        RequestLog(np.zeros(3), np.zeros(2), np.zeros(3), np.zeros(3), np.zeros(3), [None] * 3)
    o = overload(1, "same")
    with pytest.raises(ValueError, match="after start"):
        OverloadPhase("x", o.reference, o.candidate, 10.0, 5.0)
