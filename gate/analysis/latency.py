"""Latency checks: scenario x metric (TTFT, ITL, E2E) x (quantile, tail), paired and blocked.

Each check compares the two engines request by request (paired.py): the samples are joined by
schedule id, cut into blocks fixed by the plan, reduced to one log ratio per block and tested
with an anytime-valid t test against log(1 + tolerance):

    fail          the whole interval lies above the threshold: evidence of a regression;
    pass          the whole interval lies below it;
    inconclusive  neither. It holds the gate only when the policy `require`s the check;
                  otherwise the gate reports it with the smallest regression it could have
                  detected at its size ("could detect p90 >= +11%") and decides on the rest.

Holding on evidence only is what lets identical engines continue at the sizes people run: at
1,000 requests a p90 cannot be pinned to within 10% on a busy engine, and a gate that holds
every candidate it cannot tell apart from the reference is switched off by its users. What the
gate could not show is never hidden: it is a check in the verdict, with its interval.

Two ways to ask: under a `Plan` (plan.py), at any prefix, as the gate looks while the load
runs; or once, at a scenario's end, with a plan built from the sizes held (one look, valid for
that look).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from gate.analysis.checks import ratio_check
from gate.analysis.estimates import hd_quantile
from gate.analysis.paired import (
    MIN_BLOCKS,
    BlockTest,
    block_stats,
    block_test,
    correlation_time,
    detectable_shift,
    join,
)
from gate.analysis.plan import METRIC_LABEL, Plan, PlannedCheck, tolerance_of
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.types import ArmSamples, Check, Decision, ScenarioSamples

__all__ = ["fmt_ratio", "latency_checks", "planned_latency_checks", "slowest_mean"]


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


def fmt_shift(ratio: float) -> str:
    """1.11 -> '+11%'."""
    if not math.isfinite(ratio):
        return "any size"
    x = ratio - 1.0
    return f"+{x:.0%}" if x >= 0.1 else f"+{x:.1%}"


def slowest_mean(x: np.ndarray, share: float) -> float:
    """Mean of the slowest `share` of the values (at least one)."""
    k = max(1, math.ceil(share * x.size))
    return float(np.partition(x, x.size - k)[x.size - k :].mean())


def _ids(arm: ArmSamples, metric: str) -> np.ndarray | None:
    return arm.ids.get(metric)


def _no_data_check(s: ScenarioSamples, pc: PlannedCheck, policy: Policy) -> Check:
    ref_n = int(s.reference.metric(pc.metric).size)
    cand_n = int(s.candidate.metric(pc.metric).size)
    if cand_n == 0:
        why = f"the candidate has no samples (the reference has {ref_n})"
    else:
        why = f"the reference has no samples (the candidate has {cand_n})"
    return ratio_check(
        pc.id,
        pc.metric,
        "undecided",
        f"{pc.label} in {s.name} cannot be compared: {why}.",
        scenario=s.name,
        quantile=pc.q,
        threshold=1.0 + tolerance_of(policy, pc.q),
        samples=(ref_n, cand_n),
        block_requests=pc.block,
    )


def _decide(
    s: ScenarioSamples,
    pc: PlannedCheck,
    policy: Policy,
    bt: BlockTest,
    pairs: int,
    tau: float,
    final: bool,
) -> Check:
    metric, q = pc.metric, pc.q
    ref_all, cand_all = s.reference.metric(metric), s.candidate.metric(metric)
    tol = tolerance_of(policy, q)
    theta = math.log1p(tol)
    threshold = 1.0 + tol
    label = f"{pc.label} in {s.name}"
    share = 1.0 - policy.tail.start
    est_r = hd_quantile(ref_all, q) if q is not None else slowest_mean(ref_all, share)
    est_c = hd_quantile(cand_all, q) if q is not None else slowest_mean(cand_all, share)
    common = {
        "scenario": s.name,
        "quantile": q,
        "reference": est_r,
        "candidate": est_c,
        "threshold": threshold,
        "samples": (int(ref_all.size), int(cand_all.size)),
        "alpha": pc.alpha,
        "required": pc.required,
        "correlation_requests": None if math.isnan(tau) else tau,
        "block_requests": pc.block,
    }
    if bt.blocks < MIN_BLOCKS:
        # Nothing of this metric can be compared: its first check holds (a scenario the spec
        # asked for is never silently skipped), its others only say so.
        common["required"] = pc.required or pc.q == policy.checked_quantiles[0]
        return ratio_check(
            pc.id,
            metric,
            "undecided",
            f"{label} cannot be compared: {pairs} paired requests make {bt.blocks} blocks of "
            f"{pc.block}, and the paired test needs {MIN_BLOCKS} ({MIN_BLOCKS * pc.block} "
            "requests per engine; raise the scenario's requests).",
            ratio=est_c / est_r if est_r > 0.0 else None,
            **common,  # type: ignore[arg-type]
        )
    ratio = math.exp(bt.mean)
    lo, hi = math.exp(bt.lower), math.exp(bt.upper)
    t95 = float(stats.t.ppf(0.975, bt.blocks - 1))
    half = t95 * bt.sd / math.sqrt(bt.blocks)
    estimate = (math.exp(bt.mean - half), math.exp(bt.mean + half))
    detectable = math.exp(theta + detectable_shift(bt.blocks, bt.sd, pc.alpha, pc.g))
    interval_s = f"interval {fmt_ratio(lo)}-{fmt_ratio(hi)}"
    per = "request for request" if q == 0.5 else "block for block"
    decision: Decision
    if bt.lower > theta:
        decision = "fail"
        message = (
            f"{label} is {fmt_ratio(ratio)} the reference, {per} ({interval_s}), "
            f"above the {fmt_ratio(threshold, lo)} threshold."
        )
    elif bt.upper < theta:
        decision = "pass"
        message = (
            f"{label} is within tolerance: at most {fmt_ratio(hi, threshold)} the reference "
            f"(threshold {fmt_ratio(threshold, hi)})."
        )
    else:
        decision = "undecided"
        what = "the tail" if q is None else quantile_key(q)
        head = (
            f"{label} is undecided: {fmt_ratio(ratio)} the reference, and the {interval_s} "
            f"includes the {fmt_ratio(threshold)} threshold"
        )
        if not final:
            message = f"{head}; more samples may settle it."
        elif not math.isfinite(detectable):
            message = (
                f"{head}: no regression was shown, and {bt.blocks} blocks of {pc.block} are too "
                "few for this test to reject anything at its alpha"
                + ("; the policy requires it decided, so it holds." if pc.required else ".")
            )
        elif pc.required:
            message = (
                f"{head}; the policy requires it decided, so it holds (at {bt.blocks} blocks "
                f"of {pc.block} it could detect {what} >= {fmt_shift(detectable)})."
            )
        else:
            message = (
                f"{head}: no regression was shown, and at this size the gate could detect "
                f"{what} >= {fmt_shift(detectable)}."
            )
    if math.isfinite(tau) and tau > pc.block:
        message += (
            f" Requests correlate over about {tau:.0f} requests, longer than the blocks of "
            f"{pc.block}: the test's variance counts two lags of the blocks' covariance for "
            "it, and much longer correlations are beyond what that corrects."
        )
    return ratio_check(
        pc.id,
        metric,
        decision,
        message,
        ratio=ratio,
        interval=(lo, hi),
        estimate_interval=estimate,
        detectable=detectable,
        **common,  # type: ignore[arg-type]
    )


def planned_latency_checks(
    scenarios: Sequence[ScenarioSamples],
    plan: Plan,
    notes: list[str],
    final: bool = True,
) -> list[Check]:
    """Every paired quantile and tail check of the plan, at whatever prefix the scenarios hold.

    final: the scenario has ended (or this is the one-shot judge), so an undecided check says
    what it could have detected; before, it is simply not decided yet.
    """
    policy = plan.policy
    checks: list[Check] = []
    for s in scenarios:
        if s.name not in plan.requests:
            raise ValueError(f"scenario {s.name!r} is not in the plan {sorted(plan.requests)}")
        planned = plan.checks_for(s.name)
        for metric in policy.metrics:
            mine = [pc for pc in planned if pc.metric == metric]
            ref_all, cand_all = s.reference.metric(metric), s.candidate.metric(metric)
            if not ref_all.size and not cand_all.size:
                if final:
                    notes.append(
                        f"{METRIC_LABEL[metric]} not checked in {s.name}: no samples on either "
                        "engine."
                    )
                continue
            if not ref_all.size or not cand_all.size:
                checks.extend(_no_data_check(s, pc, policy) for pc in mine)
                continue
            ref, cand, _ = join(
                ref_all, _ids(s.reference, metric), cand_all, _ids(s.candidate, metric)
            )
            tau = correlation_time(np.log(np.maximum(cand, 1e-9) / np.maximum(ref, 1e-9)))
            for pc in mine:
                x = block_stats(ref, cand, pc.block, pc.q, policy.tail.start, policy.tail.top)
                bt = block_test(x, pc.alpha, pc.g)
                checks.append(_decide(s, pc, policy, bt, int(ref.size), tau, final))
    return checks


def latency_checks(
    scenarios: Sequence[ScenarioSamples], policy: Policy, notes: list[str]
) -> list[Check]:
    """The one-shot judge: each scenario seen once, at its end, under a plan of its size."""
    sizes = {s.name: max(1, min(s.reference.requests, s.candidate.requests)) for s in scenarios}
    if not sizes:
        return []
    return planned_latency_checks(scenarios, Plan.build(policy, sizes), notes)
