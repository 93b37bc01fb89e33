"""Peak, overload and recovery: how the candidate behaves when pushed, beside the reference.

References:
    I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random variables by betting",
    JRSS B 86(1), 2024 (the paired test in bounded.py).
    Y. Zhong et al., "DistServe: disaggregating prefill and decoding for goodput-optimized large
    language model serving", OSDI 2024 (goodput: requests meeting every SLO).

The gate drives one mirrored schedule through both engines, so request i of a phase was sent to
both at the same instant: each request gives a pair of outcomes, and comparing the pairs cancels
the load swings both engines saw.

Peak (`goodput_check`): a request counts toward goodput when it succeeded and met every SLO the
phase sets (TTFT, mean ITL, E2E). The candidate may lose at most `goodput_tolerance` of goodput;
the paired betting sequence on g_c - g_r decides, at the load budget: fail when its whole
interval is below -tolerance, pass when above, inconclusive otherwise.

Overload (`overload_check`): a request sent during the overload window either succeeded in time,
was shed (HTTP 429 or 503 within `shed_fast_ms`: the engine protected itself and a client can
retry elsewhere) or collapsed (timed out, failed to connect, was cut off, got any other error or
a slow rejection, or succeeded with a TTFT above `collapse_ttft_factor` x the reference's
pre-overload TTFT p50: the queue exploded instead of being shed). Shedding is a design choice
and is reported, not judged; the candidate may collapse on at most `collapse_tolerance` more of
the requests than the reference (paired betting sequence, load budget).

Recovery (`recovery_check`): each engine's own pre-overload TTFT p50 is its level; after the
overload ends, consecutive windows of `recovery_window_s` (by send time) take the TTFT p50 of
the requests sent in them, a failed request counting as infinitely slow; an engine has recovered
at the start of the first window that, with the two after it, is within `recovery_band` of its
level (three windows, so a single lucky window is not a recovery). One overload per engine is
one observation, so the times are compared by a rule, like startup: the candidate may take
(1 + recovery_tolerance) x the reference's time + recovery_slack_s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gate.analysis.bounded import paired_mean_cs
from gate.analysis.checks import compared, rule_check, statistic_check
from gate.analysis.policy import Policy
from gate.analysis.types import Check, Decision

__all__ = [
    "OverloadPhase",
    "PeakPhase",
    "RequestLog",
    "Slo",
    "goodput_check",
    "load_checks",
    "overload_check",
    "recovery_check",
    "recovery_time_s",
]

SHED_STATUSES = (429, 503)
_RECOVERY_WINDOWS = 3
_MIN_WINDOW_REQUESTS = 5


def _float_array(values: object) -> np.ndarray:
    arr = np.array(values, dtype=np.float64, copy=True).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class RequestLog:
    """One engine's requests of a load phase, one entry per request, in send order.

    sent_s: send offset from the phase start; ttft_ms: NaN when no token arrived; itl_ms: the
    request's mean inter-token gap, NaN with fewer than two tokens; e2e_ms: send to last event
    (for a failed request, to the failure; NaN if it never ended); status: HTTP status, 0 when
    there was none; error: the error kind (loadgen's kinds) or None for a success.
    """

    sent_s: np.ndarray
    ttft_ms: np.ndarray
    itl_ms: np.ndarray
    e2e_ms: np.ndarray
    status: np.ndarray
    error: tuple[str | None, ...]

    def __post_init__(self) -> None:
        for name in ("sent_s", "ttft_ms", "itl_ms", "e2e_ms"):
            object.__setattr__(self, name, _float_array(getattr(self, name)))
        status = np.array(self.status, dtype=np.int64, copy=True).reshape(-1)
        status.setflags(write=False)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "error", tuple(self.error))
        n = self.sent_s.size
        sizes = {
            "ttft_ms": self.ttft_ms.size,
            "itl_ms": self.itl_ms.size,
            "e2e_ms": self.e2e_ms.size,
            "status": self.status.size,
            "error": len(self.error),
        }
        bad = {k: v for k, v in sizes.items() if v != n}
        if bad:
            raise ValueError(f"every column needs {n} entries (one per request), got {bad}")
        if not np.isfinite(self.sent_s).all():
            raise ValueError("sent_s must be finite")

    def __len__(self) -> int:
        return int(self.sent_s.size)

    @property
    def ok(self) -> np.ndarray:
        return np.array([e is None for e in self.error], dtype=bool)

    def head(self, n: int) -> RequestLog:
        """The first n requests (a sequential caller's prefix)."""
        return RequestLog(
            self.sent_s[:n],
            self.ttft_ms[:n],
            self.itl_ms[:n],
            self.e2e_ms[:n],
            self.status[:n],
            self.error[:n],
        )


@dataclass(frozen=True)
class Slo:
    """Service-level objectives of a peak phase; None leaves that metric out of goodput."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def met(self, log: RequestLog) -> np.ndarray:
        """Per request: succeeded and met every SLO given (a missing ITL, one token, meets)."""
        good = log.ok.copy()
        with np.errstate(invalid="ignore"):
            if self.ttft_ms is not None:
                good &= log.ttft_ms <= self.ttft_ms
            if self.itl_ms is not None:
                good &= np.isnan(log.itl_ms) | (log.itl_ms <= self.itl_ms)
            if self.e2e_ms is not None:
                good &= log.e2e_ms <= self.e2e_ms
        return good

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT <= {self.ttft_ms:g} ms")
        if self.itl_ms is not None:
            parts.append(f"ITL <= {self.itl_ms:g} ms")
        if self.e2e_ms is not None:
            parts.append(f"E2E <= {self.e2e_ms:g} ms")
        return " and ".join(parts) if parts else "success"


@dataclass(frozen=True)
class PeakPhase:
    """A phase at peak load, mirrored to both engines, judged by goodput under its SLOs."""

    name: str
    reference: RequestLog
    candidate: RequestLog
    slo: Slo = field(default_factory=Slo)


@dataclass(frozen=True)
class OverloadPhase:
    """A scenario that runs below capacity, overloads between start_s and end_s (send time
    from the phase start), then falls back, mirrored to both engines."""

    name: str
    reference: RequestLog
    candidate: RequestLog
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)):
            raise ValueError("overload start_s and end_s must be finite")
        if self.end_s <= self.start_s:
            raise ValueError(f"overload end_s {self.end_s} must be after start_s {self.start_s}")


def _paired(ref: np.ndarray, cand: np.ndarray, name: str, notes: list[str]) -> int:
    n = min(ref.size, cand.size)
    if ref.size != cand.size:
        notes.append(
            f"{name}: the arms logged {ref.size} and {cand.size} requests of one mirrored "
            f"schedule; the first {n} pairs are compared."
        )
    return n


def _pp(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _interval_s(lo: float, hi: float) -> str:
    return f"{100.0 * lo:+.1f} to {100.0 * hi:+.1f} points"


def goodput_check(phase: PeakPhase, policy: Policy, alpha: float, notes: list[str]) -> Check:
    """Goodput of the candidate vs the reference under peak load (module docstring)."""
    tol = policy.load.goodput_tolerance
    g_r = phase.slo.met(phase.reference).astype(np.float64)
    g_c = phase.slo.met(phase.candidate).astype(np.float64)
    n = _paired(g_r, g_c, f"Goodput in {phase.name}", notes)
    cid, samples = f"{phase.name}.goodput", (int(g_r.size), int(g_c.size))
    if n == 0:
        return statistic_check(
            cid,
            "peak",
            "goodput",
            "undecided",
            f"Goodput in {phase.name} cannot be compared: no requests in one arm.",
            scenario=phase.name,
            threshold=-tol,
            samples=samples,
        )
    d = g_c[:n] - g_r[:n]
    lo, hi = paired_mean_cs(d, alpha)
    frac_r, frac_c = float(g_r[:n].mean()), float(g_c[:n].mean())
    told = (
        f"Goodput ({phase.slo.describe()}) in {phase.name} is {_pp(frac_c)} for the candidate vs "
        f"{_pp(frac_r)} for the reference (difference {_interval_s(lo, hi)})"
    )
    decision: Decision
    if hi < -tol:
        decision = "fail"
        message = f"{told}: below the allowed loss of {100.0 * tol:.1f} points."
    elif lo > -tol:
        decision = "pass"
        message = f"{told}: within the allowed loss of {100.0 * tol:.1f} points."
    else:
        decision = "undecided"
        message = (
            f"{told}: the interval includes the allowed loss of {100.0 * tol:.1f} points; "
            "more requests at peak would settle it."
        )
    return statistic_check(
        cid,
        "peak",
        "goodput",
        decision,
        message,
        scenario=phase.name,
        **compared(frac_r, frac_c),
        interval=(lo, hi),
        threshold=-tol,
        samples=samples,
        alpha=alpha,
    )


def _pre_ttft_p50(log: RequestLog, start_s: float) -> float | None:
    before = (log.sent_s < start_s) & log.ok & np.isfinite(log.ttft_ms)
    if not before.any():
        return None
    return float(np.median(log.ttft_ms[before]))


def classify_overload(
    log: RequestLog, start_s: float, end_s: float, ttft_limit_ms: float | None, policy: Policy
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(in window, shed, collapsed) per request, as the module docstring defines them."""
    inside = (log.sent_s >= start_s) & (log.sent_s < end_s)
    ok = log.ok
    with np.errstate(invalid="ignore"):
        fast = log.e2e_ms <= policy.load.shed_fast_ms
        shed = ~ok & np.isin(log.status, SHED_STATUSES) & fast
        slow_ok = (
            ok & (log.ttft_ms > ttft_limit_ms)
            if ttft_limit_ms is not None
            else np.zeros(len(log), dtype=bool)
        )
    collapsed = (~ok & ~shed) | slow_ok
    return inside, shed, collapsed


def overload_check(phase: OverloadPhase, policy: Policy, alpha: float, notes: list[str]) -> Check:
    """Collapse under overload, candidate vs reference (module docstring)."""
    tol = policy.load.collapse_tolerance
    level = _pre_ttft_p50(phase.reference, phase.start_s)
    limit = None if level is None else policy.load.collapse_ttft_factor * level
    if limit is None:
        notes.append(
            f"Overload in {phase.name}: no reference request before the overload, so exploding "
            "TTFT is not counted as collapse (errors and slow rejections still are)."
        )
    in_r, shed_r, col_r = classify_overload(
        phase.reference, phase.start_s, phase.end_s, limit, policy
    )
    in_c, shed_c, col_c = classify_overload(
        phase.candidate, phase.start_s, phase.end_s, limit, policy
    )
    n = _paired(in_r, in_c, f"Overload in {phase.name}", notes)
    both = in_r[:n] & in_c[:n]
    m = int(both.sum())
    cid, samples = f"{phase.name}.overload", (int(in_r.sum()), int(in_c.sum()))
    if m == 0:
        return statistic_check(
            cid,
            "overload",
            "collapse",
            "undecided",
            f"Overload in {phase.name} cannot be judged: no request was sent in its window.",
            scenario=phase.name,
            threshold=tol,
            samples=samples,
        )
    c_r = col_r[:n][both].astype(np.float64)
    c_c = col_c[:n][both].astype(np.float64)
    lo, hi = paired_mean_cs(c_c - c_r, alpha)
    f_r, f_c = float(c_r.mean()), float(c_c.mean())
    s_r, s_c = float(shed_r[:n][both].mean()), float(shed_c[:n][both].mean())
    told = (
        f"During the overload window of scenario {phase.name}, the candidate shed {_pp(s_c)} "
        f"and collapsed on "
        f"{_pp(f_c)} of requests vs {_pp(s_r)} and {_pp(f_r)} for the reference (collapse "
        f"difference {_interval_s(lo, hi)})"
    )
    decision: Decision
    if lo > tol:
        decision = "fail"
        message = (
            f"{told}: it collapses (timeouts, errors, exploding TTFT) where the reference "
            f"copes, beyond the {100.0 * tol:.1f}-point tolerance."
        )
    elif hi < tol:
        decision = "pass"
        message = f"{told}: within the {100.0 * tol:.1f}-point tolerance."
    else:
        decision = "undecided"
        message = (
            f"{told}: the interval includes the {100.0 * tol:.1f}-point tolerance; a longer "
            "overload would settle it."
        )
    return statistic_check(
        cid,
        "overload",
        "collapse",
        decision,
        message,
        scenario=phase.name,
        **compared(f_r, f_c),
        interval=(lo, hi),
        threshold=tol,
        samples=samples,
        alpha=alpha,
    )


def recovery_time_s(
    log: RequestLog, start_s: float, end_s: float, window_s: float, band: float
) -> tuple[float | None, float | None]:
    """(seconds from the end of the overload to recovery or None, the pre-overload p50)."""
    level = _pre_ttft_p50(log, start_s)
    if level is None:
        return None, None
    after = log.sent_s >= end_s
    if not after.any():
        return None, level
    ttft = np.where(log.ok & np.isfinite(log.ttft_ms), log.ttft_ms, math.inf)
    last = float(log.sent_s[after].max())
    n_windows = math.floor((last - end_s) / window_s) + 1
    within: list[bool] = []
    for k in range(n_windows):
        lo = end_s + k * window_s
        sel = (log.sent_s >= lo) & (log.sent_s < lo + window_s)
        if int(sel.sum()) < _MIN_WINDOW_REQUESTS:
            within.append(False)
            continue
        within.append(float(np.median(ttft[sel])) <= (1.0 + band) * level)
    for k in range(n_windows):
        run = within[k : k + _RECOVERY_WINDOWS]
        if run and all(run) and (len(run) == _RECOVERY_WINDOWS or k + len(run) == n_windows):
            return k * window_s, level
    return None, level


def recovery_check(phase: OverloadPhase, policy: Policy) -> Check:
    """Time to recover after the overload, candidate vs reference, by a rule (module docstring)."""
    lp = policy.load
    t_r, level_r = recovery_time_s(
        phase.reference, phase.start_s, phase.end_s, lp.recovery_window_s, lp.recovery_band
    )
    t_c, level_c = recovery_time_s(
        phase.candidate, phase.start_s, phase.end_s, lp.recovery_window_s, lp.recovery_band
    )
    rule = f"{1.0 + lp.recovery_tolerance:.2f}x + {lp.recovery_slack_s:g} s"
    limit = None if t_r is None else (1.0 + lp.recovery_tolerance) * t_r + lp.recovery_slack_s
    decision: Decision
    if level_r is None or level_c is None:
        decision = "undecided"
        message = (
            f"Recovery in {phase.name} cannot be judged: an engine has no successful request "
            "before the overload to recover to."
        )
    elif t_r is None and t_c is None:
        decision = "undecided"
        message = (
            f"Neither engine's TTFT p50 in {phase.name} returned within "
            f"{100.0 * lp.recovery_band:.0f}% of its pre-overload level before the phase ended; "
            "a longer cool-down would settle it."
        )
    elif t_c is None:
        decision = "fail"
        message = (
            f"The candidate's TTFT p50 in {phase.name} never returned within "
            f"{100.0 * lp.recovery_band:.0f}% of its pre-overload {level_c:.0f} ms, while the "
            f"reference recovered {t_r:.0f} s after the overload."
        )
    elif t_r is None:
        decision = "pass"
        message = (
            f"The candidate recovered {t_c:.0f} s after the overload in {phase.name}; the "
            "reference did not recover before the phase ended."
        )
    else:
        assert limit is not None
        failed = t_c > limit
        decision = "fail" if failed else "pass"
        message = (
            f"The candidate's TTFT p50 in {phase.name} was back within "
            f"{100.0 * lp.recovery_band:.0f}% of its pre-overload level {t_c:.0f} s after the "
            f"overload vs {t_r:.0f} s for the reference, {'above' if failed else 'within'} the "
            f"{limit:.0f} s allowed ({rule})."
        )
    return rule_check(
        f"{phase.name}.recovery",
        "recovery",
        "recovery_s",
        decision,
        message,
        scenario=phase.name,
        **compared(t_r, t_c),
        threshold=limit,
        samples=(len(phase.reference), len(phase.candidate)),
    )


def load_checks(
    peaks: Sequence[PeakPhase],
    overloads: Sequence[OverloadPhase],
    policy: Policy,
    notes: list[str],
) -> list[Check]:
    """Goodput per peak phase and collapse per overload phase share the load budget evenly;
    recovery is a rule and spends none."""
    tests = len(peaks) + len(overloads)
    budget = policy.group_alpha("load")
    checks: list[Check] = []
    if tests and budget <= 0.0:
        notes.append(
            "Peak and overload phases were run but alpha_split gives load no budget: goodput "
            "and collapse not tested."
        )
    else:
        alpha = budget / tests if tests else 0.0
        checks.extend(goodput_check(p, policy, alpha, notes) for p in peaks)
        checks.extend(overload_check(o, policy, alpha, notes) for o in overloads)
    checks.extend(recovery_check(o, policy) for o in overloads)
    return checks
