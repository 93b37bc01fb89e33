"""Latency checks: scenario x metric (TTFT, ITL, E2E) x quantile, decided by confidence sequences.

References:
    S. R. Howard and A. Ramdas, "Sequential estimation of quantiles with applications to
    A/B-testing and best-arm identification", Bernoulli 28(3), 2022.
    F. E. Harrell and C. E. Davis, "A new distribution-free quantile estimator",
    Biometrika 69(3), 1982.

A confidence sequence for the quantile of each arm (sequences.py), each at half the check's
alpha, gives the interval [lo_c / hi_r, hi_c / lo_r] for the candidate/reference ratio of that
quantile (latencies are positive, so an unbounded or non-positive end maps to 0 or +inf). The
check fails when the whole interval lies above 1 + tolerance, passes when it lies below, and is
inconclusive otherwise: the gate fails closed.

Two ways to ask:
    - once, at a scenario's end, without a plan (the original judge): each arm's mixture is
      tuned at its own sample size, which is a valid choice for a single look, and with
      quantiles "auto" the quantiles evaluated and the alpha split follow the sample sizes held
      (never the latencies);
    - with a `Plan` (plan.py), at any prefix: t_opt, alphas and the set of checks are fixed in
      advance, so the sequences hold at every prefix at once and a gate may look as often as
      it likes and stop on the first decisive look.
Either way the reported estimate is the Harrell-Davis ratio with a block-bootstrap interval
(estimates.py) beside the anytime interval that decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gate.analysis.checks import ratio_check
from gate.analysis.estimates import bootstrap_ratio_intervals_sorted, hd_quantiles
from gate.analysis.plan import (
    METRIC_LABEL,
    Plan,
    finite_at,
    min_samples_resolving,
    resolves,
)
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.sequences import count_bounds, min_samples_for_finite
from gate.analysis.types import Check, Decision, ScenarioSamples

__all__ = ["fmt_ratio", "latency_checks", "planned_latency_checks", "sorted_cs"]


def fmt_ratio(x: float, other: float | None = None) -> str:
    """A ratio like 1.03x; more decimals when two figures would otherwise print the same."""
    if not math.isfinite(x):
        return "unbounded" if x > 0 else "n/a"
    s = f"{x:.2f}"
    for digits in (2, 3, 4):
        s = f"{x:.{digits}f}"
        if other is None or not math.isfinite(other) or s != f"{other:.{digits}f}":
            break
    return f"{s}x"


def sorted_cs(
    xs: np.ndarray, q: float, alpha_arm: float, t_opt: int | None = None
) -> tuple[float, float]:
    """One arm's confidence sequence for its q-quantile, read off its sorted sample.

    With a fixed t_opt this is the time-uniform sequence read at the current size: valid at
    every size at once, for the quantile of the distribution averaged over the samples so far.
    That target moves when the load drifts (both arms of a mirrored design drift together, so
    the ratio does not), which is why looks are not intersected over time: an intersection
    assumes one fixed quantile and, under drift, would soon cover nothing.
    """
    t = int(xs.size)
    k_lo, k_hi = count_bounds(t, q, alpha_arm, t_opt)
    lower = float(xs[k_lo - 1]) if k_lo >= 1 else -math.inf
    upper = float(xs[k_hi]) if k_hi < t else math.inf
    return lower, upper


@dataclass(frozen=True)
class _Arms:
    """One scenario x metric: both arms in send order, sorted once for everything."""

    scenario: str
    metric: str
    ref: np.ndarray
    cand: np.ndarray
    ref_order: np.ndarray | None
    cand_order: np.ndarray | None
    ref_sorted: np.ndarray
    cand_sorted: np.ndarray
    ref_offsets: np.ndarray | None
    cand_offsets: np.ndarray | None

    @classmethod
    def of(cls, s: ScenarioSamples, metric: str, orders: bool) -> _Arms:
        """orders: keep the sorting permutations (the bootstrap needs them); a plain sort is
        twice as fast, which matters to a gate looking every few hundred requests."""
        ref = s.reference.metric(metric)
        cand = s.candidate.metric(metric)
        ref_order = np.argsort(ref) if orders else None
        cand_order = np.argsort(cand) if orders else None
        return cls(
            scenario=s.name,
            metric=metric,
            ref=ref,
            cand=cand,
            ref_order=ref_order,
            cand_order=cand_order,
            ref_sorted=ref[ref_order] if ref_order is not None else np.sort(ref),
            cand_sorted=cand[cand_order] if cand_order is not None else np.sort(cand),
            ref_offsets=s.reference.offsets_s.get(metric),
            cand_offsets=s.candidate.offsets_s.get(metric),
        )

    @property
    def n_min(self) -> int:
        return int(min(self.ref.size, self.cand.size))

    def label(self, q: float) -> str:
        return f"{METRIC_LABEL[self.metric]} {quantile_key(q)} in {self.scenario}"

    def check_id(self, q: float) -> str:
        return f"{self.scenario}.{self.metric}.{quantile_key(q)}"


@dataclass(frozen=True)
class _Estimates:
    ref: np.ndarray
    cand: np.ndarray
    intervals: list[tuple[float, float] | None]


def _estimates(a: _Arms, probs: Sequence[float], policy: Policy, bootstrap: bool) -> _Estimates:
    ref = hd_quantiles(a.ref_sorted, probs, presorted=True)
    cand = hd_quantiles(a.cand_sorted, probs, presorted=True)
    intervals: list[tuple[float, float] | None] = [None] * len(probs)
    if bootstrap and a.ref_order is not None and a.cand_order is not None:
        intervals = bootstrap_ratio_intervals_sorted(
            a.ref,
            a.ref_order,
            a.cand,
            a.cand_order,
            probs,
            resamples=policy.bootstrap_resamples,
            ref_offsets_s=a.ref_offsets,
            cand_offsets_s=a.cand_offsets,
            block_s=policy.bootstrap_block_s,
        )
    return _Estimates(ref, cand, intervals)


def _no_data_check(
    scenario: str, metric: str, q: float, ref_n: int, cand_n: int, policy: Policy
) -> Check:
    label = METRIC_LABEL[metric]
    if ref_n == 0 and cand_n == 0:
        why = "neither arm has samples"
    elif cand_n == 0:
        why = f"the candidate has no samples (reference has {ref_n})"
    else:
        why = f"the reference has no samples (candidate has {cand_n})"
    return ratio_check(
        f"{scenario}.{metric}.{quantile_key(q)}",
        metric,
        "inconclusive",
        f"{label} in {scenario} cannot be compared: {why}.",
        scenario=scenario,
        quantile=q,
        threshold=1.0 + policy.tolerance_for(q),
        samples=(ref_n, cand_n),
    )


def _too_few_check(a: _Arms, q: float, need: int, policy: Policy) -> Check:
    return ratio_check(
        a.check_id(q),
        a.metric,
        "inconclusive",
        f"{METRIC_LABEL[a.metric]} in {a.scenario} cannot be compared: {a.n_min} samples "
        f"per arm, and bounding even its {quantile_key(q)} needs {need}.",
        scenario=a.scenario,
        quantile=q,
        threshold=1.0 + policy.tolerance_for(q),
        samples=(int(a.ref.size), int(a.cand.size)),
    )


def _decide(
    a: _Arms,
    q: float,
    alpha: float,
    policy: Policy,
    ref_cs: tuple[float, float],
    cand_cs: tuple[float, float],
    est_r: float,
    est_c: float,
    estimate_interval: tuple[float, float] | None,
    t_opt: int | None,
) -> Check:
    lo_r, hi_r = ref_cs
    lo_c, hi_c = cand_cs
    ratio_lo = lo_c / hi_r if lo_c > 0.0 and math.isfinite(hi_r) and hi_r > 0.0 else 0.0
    ratio_hi = hi_c / lo_r if lo_r > 0.0 and math.isfinite(hi_c) else math.inf
    threshold = 1.0 + policy.tolerance_for(q)
    ratio = est_c / est_r if est_r > 0.0 else math.nan
    thr_s = fmt_ratio(threshold)
    interval_s = f"interval {fmt_ratio(ratio_lo)}-{fmt_ratio(ratio_hi)}"
    label = a.label(q)
    decision: Decision
    if ratio_lo > threshold:
        decision = "fail"
        message = (
            f"{label} is {fmt_ratio(ratio)} the reference ({interval_s}), "
            f"above the {fmt_ratio(threshold, ratio_lo)} threshold."
        )
    elif ratio_hi < threshold:
        decision = "pass"
        message = (
            f"{label} is within tolerance: at most {fmt_ratio(ratio_hi, threshold)} the "
            f"reference (threshold {fmt_ratio(threshold, ratio_hi)})."
        )
    else:
        decision = "inconclusive"
        if not (math.isfinite(ratio_hi) and ratio_lo > 0.0):
            need = min_samples_for_finite(q, alpha / 2.0, t_opt)
            more = f"{a.n_min} samples per arm bound it on both sides only from {need} on"
        else:
            more = "more samples would settle it"
        message = (
            f"{label} is undecided: {fmt_ratio(ratio)} the reference, but the "
            f"{interval_s} includes the {thr_s} threshold; {more}."
        )
    return ratio_check(
        a.check_id(q),
        a.metric,
        decision,
        message,
        scenario=a.scenario,
        quantile=q,
        reference=est_r,
        candidate=est_c,
        ratio=ratio,
        interval=(ratio_lo, ratio_hi),
        threshold=threshold,
        samples=(int(a.ref.size), int(a.cand.size)),
        alpha=alpha,
        estimate_interval=estimate_interval,
    )


def _not_established(check: Check, label: str, n_min: int, need: int) -> str:
    lo, hi = check.interval or (0.0, math.inf)
    return (
        f"{label} not established: its interval {fmt_ratio(lo)}-{fmt_ratio(hi)} "
        f"is too wide at {n_min} samples per arm (it resolves from {need}); no "
        f"regression beyond {fmt_ratio(check.threshold or 1.0)} was shown."
    )


def _measured(
    scenarios: Sequence[ScenarioSamples],
    policy: Policy,
    notes: list[str],
    checks: list[Check],
    orders: bool,
) -> list[_Arms]:
    """Scenario x metric pairs with samples in both arms; the others become notes or checks."""
    auto = policy.quantiles == "auto"
    quantiles = policy.checked_quantiles
    out: list[_Arms] = []
    for s in scenarios:
        for metric in policy.metrics:
            ref_n = int(s.reference.metric(metric).size)
            cand_n = int(s.candidate.metric(metric).size)
            if ref_n and cand_n:
                out.append(_Arms.of(s, metric, orders))
            elif auto and not ref_n and not cand_n:
                notes.append(
                    f"{METRIC_LABEL[metric]} not checked in {s.name}: no samples in either arm."
                )
            else:
                wanted = quantiles[:1] if auto else quantiles
                checks.extend(
                    _no_data_check(s.name, metric, q, ref_n, cand_n, policy) for q in wanted
                )
    return out


def latency_checks(
    scenarios: Sequence[ScenarioSamples],
    policy: Policy,
    notes: list[str],
    bootstrap: bool = True,
) -> list[Check]:
    """The one-shot judge: each scenario seen once, at its end."""
    auto = policy.quantiles == "auto"
    quantiles = policy.checked_quantiles
    checks: list[Check] = []
    arms = _measured(scenarios, policy, notes, checks, bootstrap)
    candidates = [(a, q) for a in arms for q in quantiles]
    group_alpha = policy.group_alpha("latency")
    if auto and candidates:
        plan_arm = group_alpha / len(candidates) / 2.0
        kept: list[tuple[_Arms, float]] = []
        for a, q in candidates:
            if finite_at(a.n_min, q, plan_arm):
                kept.append((a, q))
                continue
            need = min_samples_for_finite(q, plan_arm)
            if q == quantiles[0] and not any(finite_at(a.n_min, p, plan_arm) for p in quantiles):
                # Not one quantile can be bounded: the metric was measured but cannot be
                # compared, and a gate must not continue on a comparison it did not make.
                checks.append(_too_few_check(a, q, need, policy))
            else:
                notes.append(
                    f"{a.label(q).replace(' in ', ' not checked in ', 1)}: {a.n_min} samples "
                    f"per arm bound it only from {need} on (raise the scenario's requests)."
                )
        candidates = kept
    if not candidates:
        return checks
    alpha = group_alpha / len(candidates)
    notes.append(
        f"Latency budget {group_alpha:.4g} split over {len(candidates)} quantile checks: "
        f"{alpha:.4g} each, half per arm."
    )
    for a in arms:
        probs = [q for b, q in candidates if b is a]
        if not probs:
            continue
        est = _estimates(a, probs, policy, bootstrap)
        ref_sorted, cand_sorted = a.ref_sorted, a.cand_sorted
        for j, q in enumerate(probs):
            ref_cs = sorted_cs(ref_sorted, q, alpha / 2.0)
            cand_cs = sorted_cs(cand_sorted, q, alpha / 2.0)
            check = _decide(
                a,
                q,
                alpha,
                policy,
                ref_cs,
                cand_cs,
                float(est.ref[j]),
                float(est.cand[j]),
                est.intervals[j],
                None,
            )
            if (
                auto
                and check.decision == "inconclusive"
                and q != quantiles[0]
                and not resolves(a.n_min, q, alpha / 2.0)
            ):
                # An auto-chosen upper quantile was allowed to fail (its alpha is spent), but
                # these samples cannot resolve it either way: say so instead of holding on a
                # question the spec did not ask. Listed quantiles never take this path.
                need = min_samples_resolving(q, alpha / 2.0)
                notes.append(_not_established(check, a.label(q), a.n_min, need))
                continue
            checks.append(check)
    return checks


def planned_latency_checks(
    scenarios: Sequence[ScenarioSamples],
    plan: Plan,
    notes: list[str],
    bootstrap: bool = True,
    final: bool = True,
) -> list[Check]:
    """Latency checks under a plan, at whatever prefix the scenarios hold.

    final: the scenario has ended (limit reached or stopped); only then does an auto check
    that is still undecided and unresolvable turn into a note. Before, an undecided check is
    simply not decided yet.
    """
    policy = plan.policy
    auto = policy.quantiles == "auto"
    checks: list[Check] = []
    for s in scenarios:
        if s.name not in plan.requests:
            raise ValueError(f"scenario {s.name!r} is not in the plan {sorted(plan.requests)}")
    arms = _measured(scenarios, policy, notes, checks, bootstrap)
    for a in arms:
        planned = [c for c in plan.checks_for(a.scenario) if c.metric == a.metric]
        if not planned:
            continue
        probs = tuple(c.q for c in planned)
        est = _estimates(a, probs, policy, bootstrap)
        for j, pc in enumerate(planned):
            check = _decide(
                a,
                pc.q,
                pc.alpha,
                policy,
                sorted_cs(a.ref_sorted, pc.q, pc.alpha / 2.0, pc.t_opt),
                sorted_cs(a.cand_sorted, pc.q, pc.alpha / 2.0, pc.t_opt),
                float(est.ref[j]),
                float(est.cand[j]),
                est.intervals[j],
                pc.t_opt,
            )
            if (
                final
                and auto
                and check.decision == "inconclusive"
                and not pc.required
                and not resolves(a.n_min, pc.q, pc.alpha / 2.0, pc.t_opt)
            ):
                need = min_samples_resolving(pc.q, pc.alpha / 2.0)
                notes.append(_not_established(check, a.label(pc.q), a.n_min, need))
                continue
            checks.append(check)
    return checks
