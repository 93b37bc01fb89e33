"""Latency checks: scenario x metric (TTFT, ITL, E2E) x (quantiles, tail, window, creep), paired
and blocked in time (judge v3).

Each check compares the two engines request by request (paired.py): the samples are joined by
schedule id, cut into the plan's time blocks, reduced to one statistic per block, and tested
one-sided at the alpha and beta the plan spends at this look:

    quantile  p50: the trimmed mean of each block's paired log ratios; p90 and others: the log
              ratio of block quantiles; both against log(1 + tolerance);
    tail      exceedances over the pooled slow tail, the candidate deflated by its tolerance
              (tails.py): a few percent of requests slowing;
    window    the slowest run of consecutive blocks (windows.py): a stall, a slow quarter;
    creep     a line through the blocks, judged where it ends (windows.py).

and decides

    fail       the lower bound (at the look's alpha) lies above the threshold: a regression;
    pass       the upper bound (at the look's beta) lies below it: shown within tolerance;
    undecided  neither. It holds the gate only when the policy `require`s the check;
               otherwise a continue lists it as not shown, with what the gate could detect,
               and one whose estimate is past its threshold is a warning.

Two ways to ask: under a `Plan` (plan.py), at any prefix, as the gate looks while the load
runs; or once, at a scenario's end, with a plan built from the sizes held (one look).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal, TypeVar

import numpy as np

from gate.analysis.checks import ratio_check
from gate.analysis.estimates import hd_quantiles
from gate.analysis.paired import (
    MIN_TEST_BLOCKS,
    Layout,
    block_quantiles,
    block_trimmed_means,
    correlation_time,
    detectable_shift,
    join,
    level_test,
    look_levels,
)
from gate.analysis.plan import METRIC_LABEL, Plan, PlannedCheck, tolerance_of
from gate.analysis.policy import Policy
from gate.analysis.tails import LEVELS, tail_scale
from gate.analysis.types import ArmSamples, Check, Decision, ScenarioSamples
from gate.analysis.windows import creep_test, window_test

__all__ = ["fmt_ratio", "latency_checks", "planned_latency_checks", "slowest_mean"]

_T = TypeVar("_T")

GROSS = 2.0  # an undecided estimate this many times its threshold is named in the warning


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
        threshold=1.0 + tolerance_of(policy, pc.q, pc.kind),
        samples=(ref_n, cand_n),
    )


class _Look:
    """One scenario x metric at one look: the joined pairs of the look's prefix, by block."""

    def __init__(self, s: ScenarioSamples, metric: str, plan: Plan, final: bool) -> None:
        self.s, self.metric, self.plan, self.final = s, metric, plan, final
        policy = plan.policy
        self.layout: Layout = plan.layout(s.name)
        looks = plan.look_sizes(s.name)
        n = min(s.reference.requests, s.candidate.requests)
        self.size, _, _ = look_levels(n, looks, 1.0, 1.0)
        self.looks = looks
        ref_all, cand_all = s.reference.metric(metric), s.candidate.metric(metric)
        self.ref_all, self.cand_all = ref_all, cand_all
        ref, cand, ids = join(
            ref_all, _ids(s.reference, metric), cand_all, _ids(s.candidate, metric)
        )
        rel = ids - int(s.reference.first_id)
        keep = rel < self.size
        self.m = self.layout.complete(self.size)
        block = self.layout.index(rel[keep])
        inside = block < self.m
        self.ref, self.cand = ref[keep][inside], cand[keep][inside]
        self.block = block[inside]
        self.pairs = int(self.ref.size)
        self.policy = policy
        self._p50: np.ndarray | None = None
        self._hd: dict[float, tuple[float, float]] = {}
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def hd(self, q: float) -> tuple[float, float]:
        """Each engine's Harrell-Davis q-quantile over all its samples, each sample sorted
        once per look (the p50 estimate is read by three checks)."""
        got = self._hd.get(q)
        if got is None:
            if self._sorted is None:
                self._sorted = (np.sort(self.ref_all), np.sort(self.cand_all))
            r, c = self._sorted
            got = (
                float(hd_quantiles(r, [q], presorted=True)[0]),
                float(hd_quantiles(c, [q], presorted=True)[0]),
            )
            self._hd[q] = got
        return got

    def levels(self, pc: PlannedCheck) -> tuple[float, float]:
        _, a, b = look_levels(self.size, self.looks, pc.alpha, pc.beta)
        return a, b

    def p50_blocks(self) -> np.ndarray:
        if self._p50 is None:
            x = block_trimmed_means(self.ref, self.cand, self.block, self.m)
            self._p50 = x[~np.isnan(x)]
        return self._p50

    def per_block(self) -> int:
        return max(1, round(self.pairs / max(self.m, 1)))


def _estimates(lk: _Look, pc: PlannedCheck) -> tuple[float | None, float | None]:
    ra, ca = lk.ref_all, lk.cand_all
    if not ra.size or not ca.size:
        return None, None
    if pc.kind == "tail":
        share = LEVELS[0]
        return slowest_mean(ra, share), slowest_mean(ca, share)
    return lk.hd(0.5 if pc.q is None else pc.q)


def _common(lk: _Look, pc: PlannedCheck, bt_phi: float | None) -> dict[str, object]:
    ref_est, cand_est = _estimates(lk, pc)
    corr = None
    if bt_phi is not None:
        corr = correlation_time(bt_phi) * lk.per_block()
    return {
        "scenario": lk.s.name,
        "quantile": pc.q,
        "reference": ref_est,
        "candidate": cand_est,
        "threshold": 1.0 + tolerance_of(lk.policy, pc.q, pc.kind),
        "samples": (int(lk.ref_all.size), int(lk.cand_all.size)),
        "alpha": pc.alpha,
        "required": pc.required,
        "correlation_requests": corr,
        "block_requests": lk.per_block(),
    }


def _needs(pc: PlannedCheck) -> str:
    """What a check needs to be compared, in blocks of the plan."""
    if pc.kind == "tail":
        return f"{2 * MIN_TEST_BLOCKS} blocks (the tail's jackknife takes them in pairs)"
    if pc.kind in ("window", "creep"):
        return f"{MIN_TEST_BLOCKS + 2} blocks"
    if pc.q != 0.5:
        return f"{2 * MIN_TEST_BLOCKS} blocks (a quantile takes them in pairs)"
    return f"{MIN_TEST_BLOCKS} blocks"


def _too_few(lk: _Look, pc: PlannedCheck, first: bool) -> Check:
    common = _common(lk, pc, None)
    # Nothing of this metric can be compared: its first check holds (a scenario the spec
    # asked for is never silently skipped) at the end, its others only say so; unless the
    # policy allows short scenarios, whose latency is then left undecided, as it says.
    allowed = lk.policy.short_scenarios == "allow"
    common["required"] = pc.required or (first and lk.final and not allowed)
    label = f"{pc.label} in {lk.s.name}"
    if lk.final:
        msg = (
            f"{label} cannot be compared: {lk.pairs} paired requests make {lk.m} complete "
            f"block{'s' if lk.m != 1 else ''} ({lk.layout.describe()} planned), and this "
            f"check needs {_needs(pc)}"
            + (
                "; the policy allows short scenarios, so it is left undecided."
                if allowed and first
                else " (raise the scenario's requests)."
            )
        )
    else:
        msg = f"{label}: {lk.m} blocks so far; this check starts at {_needs(pc)}."
    ref_est, cand_est = common["reference"], common["candidate"]
    ratio = (
        cand_est / ref_est
        if isinstance(ref_est, float) and isinstance(cand_est, float) and ref_est > 0
        else None
    )
    return ratio_check(pc.id, pc.metric, "undecided", msg, ratio=ratio, **common)  # type: ignore[arg-type]


def _judged(
    lk: _Look,
    pc: PlannedCheck,
    decision: Decision,
    message: str,
    ratio: float | None,
    interval: tuple[float, float],
    *,
    phi: float | None = None,
    warn: bool = True,
    **extra: object,
) -> Check:
    """A decided paired check with the look's shared fields; an undecided one past its
    threshold is a warning at the end (`_warn`) unless `warn` is False."""
    check = ratio_check(
        pc.id,
        pc.metric,
        decision,
        message,
        ratio=ratio,
        interval=interval,
        **extra,  # type: ignore[arg-type]
        **_common(lk, pc, phi),  # type: ignore[arg-type]
    )
    return _warn(check, lk) if warn else check


def _decision(lower: float, upper: float, theta: float) -> Decision:
    if lower > theta:
        return "fail"
    if upper < theta:
        return "pass"
    return "undecided"


def _undecided_text(lk: _Look, pc: PlannedCheck, head: str, detectable: float | None) -> str:
    if not lk.final:
        return f"{head}; more samples may settle it."
    what = pc.label.split(" ", 1)[1]
    could = (
        f" (at {lk.m} blocks it could detect {what} >= {fmt_shift(detectable)})"
        if detectable is not None and math.isfinite(detectable)
        else ""
    )
    if pc.required:
        return f"{head}; the policy requires it decided, so it holds{could}."
    return f"{head}: no regression was shown, and none within tolerance either{could}."


def _warn(check: Check, lk: _Look) -> Check:
    """An undecided check whose estimate is past its threshold is a warning at the end."""
    if check.decision != "undecided" or check.ratio is None or check.threshold is None:
        return check
    if not lk.final or check.holds or not check.ratio > check.threshold:
        return check
    gross = check.ratio >= GROSS * check.threshold
    why = (
        f"{check.id} is {fmt_ratio(check.ratio)} the reference, past its "
        f"{fmt_ratio(check.threshold)} threshold"
        + (" by far" if gross else "")
        + f" but not with confidence at {lk.pairs} paired requests"
    )
    return replace(check, warning=why)


def _quantile_check(lk: _Look, pc: PlannedCheck, first: bool) -> Check:
    alpha, beta = lk.levels(pc)
    if pc.q == 0.5:
        x = lk.p50_blocks()
    else:
        assert pc.q is not None
        # A quantile's block is two of the plan's blocks (64 requests at least): a block of
        # one or two batches makes a quantile far from normal, and the t test on such blocks
        # failed identical engines twice its alpha (batches of 32 in blocks of 32).
        pairs = lk.m // 2
        x = block_quantiles(lk.ref, lk.cand, lk.block // 2, pairs, pc.q) if pairs else np.zeros(0)
        x = x[~np.isnan(x)]
    if x.size < MIN_TEST_BLOCKS:
        return _too_few(lk, pc, first)
    bt = level_test(x, alpha, beta)
    tol = tolerance_of(lk.policy, pc.q, pc.kind)
    theta = math.log1p(tol)
    threshold = 1.0 + tol
    label = f"{pc.label} in {lk.s.name}"
    ratio = math.exp(bt.mean)
    lo, hi = math.exp(bt.lower), math.exp(bt.upper)
    decision = _decision(bt.lower, bt.upper, theta)
    per = "request for request" if pc.q == 0.5 else "block for block"
    interval_s = f"interval {fmt_ratio(lo)}-{fmt_ratio(hi)}"
    final_a = look_levels(lk.looks[-1], lk.looks, pc.alpha, pc.beta)[1]
    detectable = math.exp(theta + detectable_shift(bt.blocks, bt.sd, final_a, bt.df))
    if decision == "fail":
        message = (
            f"{label} is {fmt_ratio(ratio)} the reference, {per} ({interval_s}), above the "
            f"{fmt_ratio(threshold, lo)} threshold."
        )
    elif decision == "pass":
        message = (
            f"{label} is within tolerance: at most {fmt_ratio(hi, threshold)} the reference "
            f"(threshold {fmt_ratio(threshold, hi)})."
        )
    else:
        head = (
            f"{label} is undecided: {fmt_ratio(ratio)} the reference, and the {interval_s} "
            f"includes the {fmt_ratio(threshold)} threshold"
        )
        message = _undecided_text(lk, pc, head, detectable)
    message += _drift_text(lk, bt.phi)
    check = _judged(
        lk,
        pc,
        decision,
        message,
        ratio,
        (lo, hi),
        phi=bt.phi,
        estimate_interval=(math.exp(bt.estimate[0]), math.exp(bt.estimate[1])),
        detectable=detectable,
    )
    return _drift_warning(check, lk, bt.phi)


DRIFT_SHARE = 0.25
"""A drift whose correlation time is over this share of the span judged is a warning: the
gate sees too few independent stretches of it to tell it from a regression (a slow drift of
each engine on its own, judged over less than its period, reads as a shift)."""


def _drift_warning(check: Check, lk: _Look, phi: float) -> Check:
    """At the end, a check whose blocks correlate over a good part of the span judged says so:
    the test bed drifts, and the verdict rests on fewer independent stretches than blocks."""
    bs = lk.layout.block_s
    if not lk.final or check.warning or bs is None or lk.m == 0 or phi < 0.5:
        return check
    span = correlation_time(phi) * bs
    judged = lk.m * bs
    if span < DRIFT_SHARE * judged:
        return check
    return replace(
        check,
        warning=(
            f"the engines drift apart over about {span:.0f} s in {lk.s.name}, against "
            f"{judged:.0f} s judged: a slow drift is hard to tell from a regression here; a "
            "longer scenario would see it average out"
        ),
    )


def _drift_text(lk: _Look, phi: float) -> str:
    """A note when neighbouring blocks correlate: the test widened for it (say by how much)."""
    if phi < 0.3 or lk.layout.block_s is None:
        return ""
    span = correlation_time(phi) * lk.layout.block_s
    return (
        f" The engines drift apart over about {span:.0f} s (neighbouring blocks correlate "
        f"{phi:.2f}); the interval is widened {math.sqrt((1 + phi) / (1 - phi)):.1f}x for it."
    )


def _tail_check(lk: _Look, pc: PlannedCheck) -> Check:
    alpha, beta = lk.levels(pc)
    tol = tolerance_of(lk.policy, None, "tail")
    threshold = 1.0 + tol
    theta = math.log1p(tol)
    ts = tail_scale(lk.ref, lk.cand, lk.block, lk.m, alpha, beta)
    if not ts.levels:
        return _too_few(lk, pc, False)
    decision = _decision(ts.lower, ts.upper, theta)
    top = ts.decider
    est, lo, hi = math.exp(top.estimate), math.exp(top.lower), math.exp(top.upper)
    label = f"{pc.label} in {lk.s.name}"
    share = f"slowest {top.level:.1%}".replace(".0%", "%")
    interval_s = f"interval {fmt_ratio(lo)}-{fmt_ratio(hi)}"
    if decision == "fail":
        message = (
            f"{label}: the candidate's {share} of requests are {fmt_ratio(est)} the "
            f"reference's ({interval_s}, the mean of the {top.tail_requests} slowest of "
            f"each), above the {fmt_ratio(threshold, lo)} threshold."
        )
    elif decision == "pass":
        worst = math.exp(ts.upper)
        finest = min(t.level for t in ts.shown)
        message = (
            f"{label} is within tolerance: the candidate's slowest 5% down to its slowest "
            f"{finest:.1%} are at most {fmt_ratio(worst, threshold)} the reference's "
            f"(threshold {fmt_ratio(threshold, worst)})".replace(".0%", "%")
            + (
                "; finer levels, too few requests to show, showed no regression."
                if len(ts.shown) < len(ts.levels)
                else "."
            )
        )
    else:
        head = (
            f"{label} is undecided: the {share} is {fmt_ratio(est)} the reference's, and the "
            f"{interval_s} includes the {fmt_ratio(threshold)} threshold"
        )
        message = _undecided_text(lk, pc, head, None)
    return _judged(lk, pc, decision, message, est, (lo, hi))


def _shape_test(
    lk: _Look,
    pc: PlannedCheck,
    kind: Literal["window", "creep"],
    test: Callable[[np.ndarray, float, float], _T],
) -> tuple[_T, float, float, str]:
    """A test of the shape of the p50 blocks at the check's levels, with its tolerance as a
    log-ratio (theta) and a ratio (threshold), and the check's label."""
    alpha, beta = lk.levels(pc)
    result = test(lk.p50_blocks(), alpha, beta)
    tol = tolerance_of(lk.policy, None, kind)
    return result, math.log1p(tol), 1.0 + tol, f"{pc.label} in {lk.s.name}"


def _window_check(lk: _Look, pc: PlannedCheck) -> Check:
    w, theta, threshold, label = _shape_test(lk, pc, "window", window_test)
    if w.runs == 0:
        return _too_few(lk, pc, False)
    decision = _decision(w.lower, w.upper, theta)
    bs = lk.layout.block_s
    where = f"blocks {w.start + 1}-{w.start + w.width} of {w.blocks}" + (
        f" ({w.start * bs:.0f}-{(w.start + w.width) * bs:.0f} s)" if bs else ""
    )
    ratio = math.exp(w.mean) if math.isfinite(w.mean) else None
    if decision == "fail":
        message = (
            f"{label}: the candidate was {fmt_ratio(math.exp(w.mean))} the reference, request "
            f"for request, over {where}, above the {fmt_ratio(threshold)} window threshold "
            f"(at least {fmt_ratio(math.exp(w.lower))} with confidence)"
            + (
                ": a stall or a slow stretch, not a steady shift."
                if w.width < w.blocks // 2
                else "."
            )
        )
    elif decision == "pass":
        message = (
            f"{label}: no run of blocks was slower than {fmt_ratio(threshold)} the reference "
            f"(every run at most {fmt_ratio(math.exp(w.upper))})."
        )
    else:
        head = (
            f"{label} is undecided: the slowest run, {where}, was "
            f"{fmt_ratio(math.exp(w.mean))} the reference, not shown below or above the "
            f"{fmt_ratio(threshold)} window threshold"
        )
        message = _undecided_text(lk, pc, head, None)
    # The run that decides: its own bounds (a pass reads every run's, said in the message).
    interval = (math.exp(w.lower), math.exp(w.upper if decision == "pass" else w.run_upper))
    return _judged(lk, pc, decision, message, ratio, interval)


def _creep_check(lk: _Look, pc: PlannedCheck) -> Check:
    c, theta, threshold, label = _shape_test(lk, pc, "creep", creep_test)
    if not math.isfinite(c.end):
        return _too_few(lk, pc, False)
    decision = _decision(c.lower, c.upper, theta)
    flat = decision == "fail" and not c.rise_lower > 0.0
    if flat:
        decision = "undecided"  # above the threshold but flat: the level checks' finding
    trend = (
        f"from {fmt_ratio(math.exp(c.start))} to {fmt_ratio(math.exp(c.end))} the reference "
        f"over {c.blocks} blocks"
    )
    interval_s = (
        f"interval at the end {fmt_ratio(math.exp(c.lower))}-{fmt_ratio(math.exp(c.upper))}"
    )
    if decision == "fail":
        message = (
            f"{label}: the candidate's paired ratio rose {trend} ({interval_s}), ending above "
            f"the {fmt_ratio(threshold)} creep threshold: a slowdown that creeps in."
        )
    elif decision == "pass":
        message = (
            f"{label}: no creep; the paired ratio's trend ends at most "
            f"{fmt_ratio(math.exp(c.upper))} the reference (threshold {fmt_ratio(threshold)})."
        )
    elif flat:
        message = (
            f"{label}: the paired ratio ends at {fmt_ratio(math.exp(c.end))} the reference, "
            f"above the {fmt_ratio(threshold)} creep threshold, but it did not rise with "
            "confidence: a steady shift (the level checks' finding), not a creep."
        )
    else:
        head = (
            f"{label} is undecided: the paired ratio's trend went {trend} ({interval_s}, "
            f"threshold {fmt_ratio(threshold)})"
        )
        message = _undecided_text(lk, pc, head, None)
    interval = (math.exp(c.lower), math.exp(c.upper))
    return _judged(lk, pc, decision, message, math.exp(c.end), interval, warn=not flat)


def planned_latency_checks(
    scenarios: Sequence[ScenarioSamples],
    plan: Plan,
    notes: list[str],
    final: bool = True,
) -> list[Check]:
    """Every paired check of the plan, at whatever prefix the scenarios hold.

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
            lk = _Look(s, metric, plan, final)
            first_q = True
            for pc in mine:
                if pc.kind == "quantile":
                    checks.append(_quantile_check(lk, pc, first_q))
                    first_q = False
                elif pc.kind == "tail":
                    checks.append(_tail_check(lk, pc))
                elif pc.kind == "window":
                    checks.append(_window_check(lk, pc))
                else:
                    checks.append(_creep_check(lk, pc))
    return checks


def latency_checks(
    scenarios: Sequence[ScenarioSamples], policy: Policy, notes: list[str]
) -> list[Check]:
    """The one-shot judge: each scenario seen once, at its end, under a plan of its size
    (blocks in time from the samples' send offsets where both arms have them)."""
    sizes = {s.name: max(1, min(s.reference.requests, s.candidate.requests)) for s in scenarios}
    if not sizes:
        return []
    times: dict[str, np.ndarray] = {}
    for s in scenarios:
        t = _send_times(s)
        if t is not None:
            times[s.name] = t
    plan = Plan.build(policy, sizes, times=times, short_ok=set(sizes))
    return planned_latency_checks(scenarios, plan, notes)


def _send_times(s: ScenarioSamples) -> np.ndarray | None:
    """Each judged request's send offset, by id, from whichever arm saw it (None if unknown)."""
    n = max(1, min(s.reference.requests, s.candidate.requests))
    out = np.full(n, np.nan)
    for arm in (s.reference, s.candidate):
        for metric, offsets in arm.offsets_s.items():
            ids = arm.ids.get(metric)
            if ids is None:
                continue
            rel = np.asarray(ids) - arm.first_id
            ok = (rel >= 0) & (rel < n)
            out[rel[ok]] = offsets[ok]
    if np.isnan(out).mean() > 0.5:
        return None
    # Requests no arm measured (errors on both) take their neighbours' times.
    idx = np.arange(n)
    good = ~np.isnan(out)
    return np.asarray(np.interp(idx, idx[good], out[good]), np.float64)
