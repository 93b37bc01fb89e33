"""The judge: samples and engine facts in, continue or hold with the evidence out.

Error control (statistics.md, "Many checks at once"): weighted Bonferroni over check groups
(policy.alpha_split), split equally inside a group, with anytime-valid tests everywhere, so the
probability of holding a candidate that meets every tolerance is at most the spent budget
whatever the dependence between checks.

Latency, per scenario x metric x quantile: a confidence sequence for the quantile of each arm
(Howard & Ramdas, see sequences.py), each at half the check's alpha, gives the interval
[lo_c / hi_r, hi_c / lo_r] for the candidate/reference ratio of that quantile (latencies are
positive, so an unbounded or non-positive end maps to 0 or +inf). The check fails
when the whole interval lies above 1 + tolerance, passes when it lies below, and is inconclusive
otherwise: the gate fails closed. With quantiles "auto", which quantiles are evaluated depends
only on sample sizes (never on the latencies): a quantile is evaluated when its CS is finite at
the available samples, judged at the alpha each would get if all were evaluated, so a large tail
regression can fail early; an evaluated upper quantile that stays undecided while the samples
cannot resolve it (its CS wider than half its tail, `_resolves`) becomes a note, not a hold.
The group's budget is then split over those kept, so the split still
sums to the group's share. With "auto", a measured metric of which not one quantile can be
bounded is an inconclusive check rather than a silent skip. Each arm's mixture is tuned at the
arm's own sample size: the judge is meant to see each scenario once, at its planned end, where
that is a valid choice; a caller that judges growing prefixes and stops on the first decisive
one must hold t_opt fixed across looks (sequences.quantile_cs) to keep the time-uniform guarantee.

Errors, per scenario: the one-sided Lindon-Malek count test (counts.py) on the arm labels of the
errors in time order, plus an absolute ceiling on the candidate's error fraction.

Startup and crashes are single observations per engine, judged by deterministic rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gate.analysis.counts import log_bayes_factors, sequential_count_pvalue
from gate.analysis.estimates import hd_quantile
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.sequences import count_bounds, min_samples_for_finite, quantile_cs
from gate.analysis.types import (
    ArmSamples,
    Check,
    Decision,
    EngineFacts,
    ScenarioSamples,
    Verdict,
)

__all__ = ["judge"]

_METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL"}
_REASON_ORDER = {"crash": 0, "startup": 1, "errors": 2, "latency": 3}


def _fmt_ratio(x: float, other: float | None = None) -> str:
    """A ratio like 1.03x; more decimals when two figures would otherwise print the same."""
    if not math.isfinite(x):
        return "unbounded" if x > 0 else "n/a"
    for digits in (2, 3, 4):
        s = f"{x:.{digits}f}"
        if other is None or not math.isfinite(other) or s != f"{other:.{digits}f}":
            break
    return f"{s}x"


def _fmt_p(p: float) -> str:
    return "p<1e-12" if p < 1e-12 else f"p={p:.2g}"


@dataclass(frozen=True)
class _Candidate:
    scenario: str
    metric: str
    q: float
    ref: np.ndarray
    cand: np.ndarray

    @property
    def id(self) -> str:
        return f"{self.scenario}.{self.metric}.{quantile_key(self.q)}"

    @property
    def label(self) -> str:
        return f"{_METRIC_LABEL[self.metric]} {quantile_key(self.q)} in {self.scenario}"


def _finite(n: int, q: float, alpha_arm: float) -> bool:
    if n <= 0:
        return False
    k_lo, k_hi = count_bounds(n, q, alpha_arm)
    return k_lo >= 1 and k_hi < n


def _resolves(n: int, q: float, alpha_arm: float) -> bool:
    """Whether n samples pin the q-quantile down usefully: the confidence sequence must lie
    within half the tail on each side (p99 between p98.5 and p99.5; p50 between p25 and p75).

    A CS that is merely finite at p99 reaches to the sample maximum, which decides nothing
    about a real engine and would turn every auto-checked gate of a thousand requests into an
    inconclusive hold. The rule depends on sample counts only, never on the latencies.
    """
    if n <= 0:
        return False
    half = (1.0 - q) / 2.0 if q >= 0.5 else q / 2.0
    k_lo, k_hi = count_bounds(n, q, alpha_arm)
    return k_lo >= 1 and k_hi < n and k_lo / n >= q - half and (k_hi + 1) / n <= q + half


@lru_cache(maxsize=256)
def min_samples_resolving(q: float, alpha_arm: float) -> int:
    """Smallest n for which `_resolves` holds (doubling, then bisection)."""
    hi = 8
    while not _resolves(hi, q, alpha_arm):
        hi *= 2
        if hi > 1 << 30:
            return hi
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if _resolves(mid, q, alpha_arm):
            hi = mid
        else:
            lo = mid
    return hi


def _no_data_check(
    scenario: str, metric: str, q: float, ref_n: int, cand_n: int, policy: Policy
) -> Check:
    label = _METRIC_LABEL[metric]
    if ref_n == 0 and cand_n == 0:
        why = "neither arm has samples"
    elif cand_n == 0:
        why = f"the candidate has no samples (reference has {ref_n})"
    else:
        why = f"the reference has no samples (candidate has {cand_n})"
    return Check(
        id=f"{scenario}.{metric}.{quantile_key(q)}",
        group="latency",
        scenario=scenario,
        metric=metric,
        quantile=q,
        reference=None,
        candidate=None,
        ratio=None,
        interval=None,
        threshold=1.0 + policy.tolerance_for(q),
        decision="inconclusive",
        samples=(ref_n, cand_n),
        alpha=None,
        message=f"{label} in {scenario} cannot be compared: {why}.",
    )


def _too_few_check(c: _Candidate, n_min: int, need: int, policy: Policy) -> Check:
    return Check(
        id=c.id,
        group="latency",
        scenario=c.scenario,
        metric=c.metric,
        quantile=c.q,
        reference=None,
        candidate=None,
        ratio=None,
        interval=None,
        threshold=1.0 + policy.tolerance_for(c.q),
        decision="inconclusive",
        samples=(int(c.ref.size), int(c.cand.size)),
        alpha=None,
        message=(
            f"{_METRIC_LABEL[c.metric]} in {c.scenario} cannot be compared: {n_min} samples "
            f"per arm, and bounding even its {quantile_key(c.q)} needs {need}."
        ),
    )


def _latency_check(c: _Candidate, alpha: float, policy: Policy) -> Check:
    alpha_arm = alpha / 2.0
    n_r, n_c = int(c.ref.size), int(c.cand.size)
    lo_r, hi_r = quantile_cs(c.ref, c.q, alpha_arm)
    lo_c, hi_c = quantile_cs(c.cand, c.q, alpha_arm)
    ratio_lo = lo_c / hi_r if lo_c > 0.0 and math.isfinite(hi_r) else 0.0
    ratio_hi = hi_c / lo_r if lo_r > 0.0 and math.isfinite(hi_c) else math.inf
    threshold = 1.0 + policy.tolerance_for(c.q)
    est_r = hd_quantile(c.ref, c.q)
    est_c = hd_quantile(c.cand, c.q)
    ratio = est_c / est_r if est_r > 0.0 else math.nan
    thr_s = _fmt_ratio(threshold)
    interval_s = f"interval {_fmt_ratio(ratio_lo)}-{_fmt_ratio(ratio_hi)}"
    decision: Decision
    if ratio_lo > threshold:
        decision = "fail"
        message = (
            f"{c.label} is {_fmt_ratio(ratio)} the reference ({interval_s}), "
            f"above the {_fmt_ratio(threshold, ratio_lo)} threshold."
        )
    elif ratio_hi < threshold:
        decision = "pass"
        message = (
            f"{c.label} is within tolerance: at most {_fmt_ratio(ratio_hi, threshold)} the "
            f"reference (threshold {_fmt_ratio(threshold, ratio_hi)})."
        )
    else:
        decision = "inconclusive"
        n_min = min(n_r, n_c)
        if not (math.isfinite(ratio_hi) and ratio_lo > 0.0):
            need = min_samples_for_finite(c.q, alpha_arm)
            more = f"{n_min} samples per arm bound it on both sides only from {need} on"
        else:
            more = "more samples would settle it"
        message = (
            f"{c.label} is undecided: {_fmt_ratio(ratio)} the reference, but the "
            f"{interval_s} includes the {thr_s} threshold; {more}."
        )
    return Check(
        id=c.id,
        group="latency",
        scenario=c.scenario,
        metric=c.metric,
        quantile=c.q,
        reference=est_r,
        candidate=est_c,
        ratio=ratio,
        interval=(ratio_lo, ratio_hi),
        threshold=threshold,
        decision=decision,
        samples=(n_r, n_c),
        alpha=alpha,
        message=message,
    )


def _latency_checks(
    scenarios: Sequence[ScenarioSamples], policy: Policy, notes: list[str]
) -> list[Check]:
    auto = policy.quantiles == "auto"
    quantiles = policy.checked_quantiles
    checks: list[Check] = []
    candidates: list[_Candidate] = []
    for s in scenarios:
        for metric in policy.metrics:
            ref = np.sort(s.reference.metric(metric))
            cand = np.sort(s.candidate.metric(metric))
            if ref.size and cand.size:
                candidates.extend(_Candidate(s.name, metric, q, ref, cand) for q in quantiles)
            elif auto and not ref.size and not cand.size:
                notes.append(
                    f"{_METRIC_LABEL[metric]} not checked in {s.name}: no samples in either arm."
                )
            else:
                wanted = quantiles[:1] if auto else quantiles
                checks.extend(
                    _no_data_check(s.name, metric, q, int(ref.size), int(cand.size), policy)
                    for q in wanted
                )
    group_alpha = policy.group_alpha("latency")
    if auto and candidates:
        plan_arm = group_alpha / len(candidates) / 2.0
        kept: list[_Candidate] = []
        for c in candidates:
            n_min = int(min(c.ref.size, c.cand.size))
            if _finite(n_min, c.q, plan_arm):
                kept.append(c)
                continue
            need = min_samples_for_finite(c.q, plan_arm)
            if c.q == quantiles[0] and not any(_finite(n_min, q, plan_arm) for q in quantiles):
                # Not one quantile can be bounded: the metric was measured but cannot be
                # compared, and a gate must not continue on a comparison it did not make.
                checks.append(_too_few_check(c, n_min, need, policy))
            else:
                notes.append(
                    f"{c.label.replace(' in ', ' not checked in ', 1)}: {n_min} samples per "
                    f"arm bound it only from {need} on (raise the scenario's requests)."
                )
        candidates = kept
    if candidates:
        alpha = group_alpha / len(candidates)
        notes.append(
            f"Latency budget {group_alpha:.4g} split over {len(candidates)} quantile checks: "
            f"{alpha:.4g} each, half per arm."
        )
        for c in candidates:
            check = _latency_check(c, alpha, policy)
            n_min = int(min(c.ref.size, c.cand.size))
            if (
                auto
                and check.decision == "inconclusive"
                and c.q != quantiles[0]
                and not _resolves(n_min, c.q, alpha / 2.0)
            ):
                # An auto-chosen upper quantile was allowed to fail (its alpha is spent), but
                # these samples cannot resolve it either way: say so instead of holding on a
                # question the spec did not ask. Listed quantiles never take this path.
                need = min_samples_resolving(c.q, alpha / 2.0)
                lo, hi = check.interval or (0.0, math.inf)
                notes.append(
                    f"{c.label} not established: its interval {_fmt_ratio(lo)}-{_fmt_ratio(hi)} "
                    f"is too wide at {n_min} samples per arm (it resolves from {need}); no "
                    f"regression beyond {_fmt_ratio(check.threshold or 1.0)} was shown."
                )
                continue
            checks.append(check)
    return checks


def _kinds(errors: Mapping[str, int]) -> str:
    items = sorted(((k, n) for k, n in errors.items() if n > 0), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {n}" for k, n in items)


def _arm_errors(role: str, arm: ArmSamples, with_requests: bool) -> str:
    n = arm.error_count
    kinds = _kinds(arm.errors)
    noun = "error" if n == 1 else "errors"
    text = f"{role} {n} {noun}" + (f" ({kinds})" if kinds else "")
    if with_requests:
        text += f" in {arm.requests} requests"
    return text


def _error_pvalue(s: ScenarioSamples, rho: float, notes: list[str]) -> float:
    ref, cand = s.reference, s.candidate
    x_r, x_c = ref.error_count, cand.error_count
    if x_r + x_c == 0:
        return 1.0
    if ref.error_offsets_s.size == x_r and cand.error_offsets_s.size == x_c:
        times = np.concatenate([ref.error_offsets_s, cand.error_offsets_s])
        labels = np.concatenate([np.zeros(x_r, dtype=np.int64), np.ones(x_c, dtype=np.int64)])
        # Stable sort: simultaneous errors keep reference-first order, a fixed, data-free rule.
        order = np.argsort(times, kind="stable")
        return sequential_count_pvalue(labels[order], rho=rho)
    # Without the order, the Bayes factor at the final counts alone is still a valid p-value
    # (Markov's inequality at one fixed time), just without the sequential power.
    notes.append(
        f"Errors in {s.name}: error times do not match the error counts, so the count test "
        "used the final counts only."
    )
    labels = np.concatenate([np.zeros(x_r, dtype=np.int64), np.ones(x_c, dtype=np.int64)])
    return float(min(1.0, math.exp(-float(log_bayes_factors(labels, rho=rho)[-1]))))


def _error_check(s: ScenarioSamples, alpha: float, policy: Policy, notes: list[str]) -> Check:
    ref, cand = s.reference, s.candidate

    def check(
        decision: Decision,
        message: str,
        fractions: tuple[float, float] | None = None,
        check_alpha: float | None = None,
    ) -> Check:
        frac_r, frac_c = fractions if fractions is not None else (None, None)
        return Check(
            id=f"{s.name}.errors",
            group="errors",
            scenario=s.name,
            metric="errors",
            quantile=None,
            reference=frac_r,
            candidate=frac_c,
            ratio=frac_c / frac_r if frac_r and frac_c is not None else None,
            interval=None,
            threshold=policy.max_error_rate,
            decision=decision,
            samples=(ref.requests, cand.requests),
            alpha=check_alpha,
            message=message,
        )

    if ref.requests == 0 or cand.requests == 0:
        empty = "the candidate" if cand.requests == 0 else "the reference"
        return check(
            "inconclusive", f"Errors in {s.name} cannot be compared: {empty} served no requests."
        )
    rho = cand.requests / (ref.requests + cand.requests)
    p = _error_pvalue(s, rho, notes)
    frac_r = ref.error_count / ref.requests
    frac_c = cand.error_count / cand.requests
    counts = (
        f"{_arm_errors('candidate', cand, True)} vs "
        f"{_arm_errors('reference', ref, False)} in {ref.requests}"
    )
    over_ceiling = frac_c > policy.max_error_rate
    significant = p <= alpha
    if not (significant or over_ceiling):
        return check(
            "pass",
            f"Errors in {s.name}: {counts}; {_fmt_p(p)} (alpha {alpha:.2g}) and an error rate of "
            f"{frac_c:.2%}, within the {policy.max_error_rate:.2%} ceiling.",
            (frac_r, frac_c),
            alpha,
        )
    why = []
    if significant:
        why.append(f"{_fmt_p(p)} is at or below alpha {alpha:.2g}")
    if over_ceiling:
        why.append(
            f"the candidate's error rate {frac_c:.2%} is above the "
            f"{policy.max_error_rate:.2%} ceiling"
        )
    return check(
        "fail", f"Errors in {s.name}: {counts}; {' and '.join(why)}.", (frac_r, frac_c), alpha
    )


def _error_checks(
    scenarios: Sequence[ScenarioSamples], policy: Policy, notes: list[str]
) -> list[Check]:
    comparable = sum(1 for s in scenarios if s.reference.requests and s.candidate.requests)
    alpha = policy.group_alpha("errors") / comparable if comparable else 0.0
    return [_error_check(s, alpha, policy, notes) for s in scenarios]


def _startup_check(
    engines: Sequence[EngineFacts], policy: Policy, notes: list[str]
) -> Check | None:
    ref = next((e for e in engines if e.role == "reference"), None)
    cand = next((e for e in engines if e.role == "candidate"), None)
    if ref is None or cand is None:
        missing = "reference" if ref is None else "candidate"
        notes.append(f"Startup not compared: no facts about the {missing} engine.")
        return None
    if ref.ready_s is None or cand.ready_s is None:
        attached = [e.role for e in (ref, cand) if e.ready_s is None]
        notes.append(
            f"Startup not compared: the {' and '.join(attached)} endpoint was attached, "
            "not launched by the gate."
        )
        return None
    limit = ref.ready_s * (1.0 + policy.startup_tolerance) + policy.startup_slack_s
    rule = f"{1.0 + policy.startup_tolerance:.2f}x + {policy.startup_slack_s:g} s"
    told = (
        f"The candidate became ready in {cand.ready_s:.1f} s vs {ref.ready_s:.1f} s for the "
        f"reference"
    )
    failed = cand.ready_s > limit
    where = "above" if failed else "within"
    return Check(
        id="startup.ready",
        group="startup",
        scenario=None,
        metric="ready_s",
        quantile=None,
        reference=ref.ready_s,
        candidate=cand.ready_s,
        ratio=cand.ready_s / ref.ready_s if ref.ready_s > 0.0 else None,
        interval=None,
        threshold=limit,
        decision="fail" if failed else "pass",
        samples=(1, 1),
        alpha=None,
        message=f"{told}, {where} the {limit:.1f} s allowed ({rule}).",
    )


def _crash_checks(engines: Sequence[EngineFacts]) -> list[Check]:
    checks: list[Check] = []
    seen: dict[str, int] = {}
    for e in engines:
        seen[e.role] = seen.get(e.role, 0) + 1
        cid = f"crash.{e.role}" if seen[e.role] == 1 else f"crash.{e.role}.{seen[e.role]}"
        detail = e.crash_detail or "no detail recorded"
        if not e.crashed:
            message = f"The {e.role} engine ran without crashing."
        elif e.role == "candidate":
            message = f"The candidate engine crashed: {detail}."
        else:
            message = (
                f"The reference engine crashed ({detail}), so the comparison is void; the gate "
                "holds rather than judge the candidate against a broken baseline."
            )
        checks.append(
            Check(
                id=cid,
                group="crash",
                scenario=None,
                metric="crashed",
                quantile=None,
                reference=None,
                candidate=None,
                ratio=None,
                interval=None,
                threshold=None,
                decision="fail" if e.crashed else "pass",
                samples=(0, 0),
                alpha=None,
                message=message,
            )
        )
    return checks


def judge(
    scenarios: Sequence[ScenarioSamples], engines: Sequence[EngineFacts], policy: Policy
) -> Verdict:
    """Continue only when every evaluated check passes and latency was actually compared.

    Anything else holds: a failure is evidence of a regression, an inconclusive check is a lack
    of evidence, and the gate fails closed on both.
    """
    notes: list[str] = []
    checks: list[Check] = []
    checks.extend(_latency_checks(scenarios, policy, notes))
    if not any(c.group == "latency" for c in checks):
        checks.append(
            Check(
                id="latency.coverage",
                group="latency",
                scenario=None,
                metric="latency",
                quantile=None,
                reference=None,
                candidate=None,
                ratio=None,
                interval=None,
                threshold=None,
                decision="inconclusive",
                samples=(0, 0),
                alpha=None,
                message=(
                    "No latency quantile could be compared in any scenario, so there is no "
                    "evidence that the candidate is as fast as the reference."
                ),
            )
        )
    checks.extend(_error_checks(scenarios, policy, notes))
    startup = _startup_check(engines, policy, notes)
    if startup is not None:
        checks.append(startup)
    checks.extend(_crash_checks(engines))
    reasons = sorted(
        (c for c in checks if c.decision != "pass"),
        key=lambda c: (c.decision != "fail", _REASON_ORDER[c.group]),
    )
    return Verdict(
        decision="hold" if reasons else "continue",
        checks=tuple(checks),
        reasons=tuple(reasons),
        notes=tuple(notes),
    )
