"""Error checks per scenario: a sequential count test over all errors and per kind, a ceiling,
and hard holds on broken outputs.

References:
    M. Lindon and A. Malek, "Anytime-valid inference for multinomial count data", NeurIPS 2022.
    V. Vovk and R. Wang, "E-values: calibration, combination and applications", Annals of
    Statistics 49(3), 2021.

Why this shape: errors are rare events of several kinds, and a regression often shows as one
new kind (timeouts) amid an unchanged background (client 4xx). The pooled Lindon-Malek test
sees a general rise; the per-kind components see a new kind; their fixed-weight mixture
(counts.kind_mixture_pvalues) is one anytime-valid test inside the errors budget, so looking at
every prefix and splitting by kind cost nothing extra in false holds.

Bursts: a stalled engine fails many requests at once, and fifteen timeouts of one stall are
one event, not fifteen independent coins (as coins they alone would give p = 0.009). The count
test therefore sees events: an arm's errors less than `error_burst_s` apart are one event, of
the kind of its first error. A burst on the candidate holds only when the candidate's events
outnumber the reference's own beyond chance.

The ceiling (`max_error_rate`) is judged, not thresholded: it holds only when the candidate's
error rate is above it with confidence, by a one-sided t test on the failed fractions of time
blocks of four plan blocks (8 s at least), its alpha spent over the planned looks, so an engine
at the ceiling is held at most about alpha of the time whichever look stops the scenario.
The same test on the reference says when the test bed itself is unhealthy: a reference above
the ceiling with confidence makes a `gate.environment` check that holds and names the
environment, and the candidate's rate above the ceiling is then not counted against it (the
count test still compares the two). The scenario's errors alpha is split in quarters: the count
test on episodes, a block-for-block test of failed fractions over the plan's time blocks (where
errors are dense: an engine that fails all the time is one long episode), and each ceiling test
(judged on the time blocks' failed fractions, so a bad period moves a few blocks, not many
coins).

Episodes (judge v3): errors of one engine less than `error_burst_s` apart chain into one event,
however long the bad period lasts. The count test can reject but never accept; before the
planned end the errors check passes only when it has no evidence and the candidate's failed
share so far is within `error_tolerance` of the reference's and under the ceiling, so a clean
scenario may stop early with its latency shown; otherwise it runs on.

A response with a NaN or infinite logprob, or a successful response without a token, is a broken
engine: `outputs_checks` holds on it without statistics (no alpha).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from gate.analysis.checks import compared, rule_check, statistic_check
from gate.analysis.counts import (
    kind_mixture_pvalues,
)
from gate.analysis.paired import MIN_TEST_BLOCKS, Layout, level_test, look_levels
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.types import ArmSamples, Check, Decision, ScenarioSamples

__all__ = ["burst_events", "error_check", "error_checks", "outputs_checks"]


def fmt_p(p: float) -> str:
    return "p<1e-12" if p < 1e-12 else f"p={p:.2g}"


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


def _events(arm: ArmSamples) -> tuple[np.ndarray, list[str]] | None:
    """Error times and kinds of one arm, or None when they do not match its counts."""
    n = arm.error_count
    if arm.error_offsets_s.size != n:
        return None
    if len(arm.error_kinds) == n:
        return arm.error_offsets_s, list(arm.error_kinds)
    if len(arm.errors) == 1 or n == 0:
        # One kind only: every error is of it, whatever the order.
        only = next((k for k, c in arm.errors.items() if c > 0), "other")
        return arm.error_offsets_s, [only] * n
    return None


def burst_events(
    times: np.ndarray, kinds: list[str], window_s: float
) -> tuple[np.ndarray, list[str]]:
    """One arm's errors as episodes: errors that follow each other by less than `window_s`
    chain into one episode (a bad period of any length, as long as it keeps failing, is one
    event). Each episode is at its first error's time, of its kind."""
    if times.size == 0 or window_s <= 0.0:
        return times, list(kinds)
    order = np.argsort(times, kind="stable")
    t = times[order]
    starts = np.flatnonzero(np.diff(t, prepend=-math.inf) >= window_s)
    picked = order[starts]
    return times[picked], [kinds[i] for i in picked]


DENSE_ERRORS = 0.75
"""The share of time blocks in which the candidate fails at least once for the block-for-block
test of failed fractions to apply: a candidate failing all the time fails in nearly every block,
while identical engines with 10 s bad periods (2 per 100 s) fail in about a third of theirs."""

ENVIRONMENT = "gate.environment"


@dataclass(frozen=True)
class _Blocks:
    """The failed fraction of each complete time block of both arms, and the look's levels."""

    ref: np.ndarray
    cand: np.ndarray
    alpha: float
    beta: float


CEILING_GROUP = 4
"""Plan blocks per block of the ceiling tests (8 s at least): a 10 s bad period then moves one
or two of them, not five, and the t test over them does not read one episode as many (with
blocks of 2 s, identical engines with 10 s bad periods at a mean rate of 0.8% were held above
the 1% ceiling in 1.5% of gates; at 8 s the bad period is the unit it should be)."""


def _fractions(arm: ArmSamples, layout: Layout, size: int, group: int = 1) -> np.ndarray | None:
    """The failed fraction of each complete block (of `group` plan blocks) of the first `size`
    judged requests (None without the errors' schedule ids: then the count alone is known)."""
    if arm.error_ids is None:
        return None
    m = layout.complete(size) // group
    if m == 0:
        return np.zeros(0)
    edges = np.asarray(layout.edges[: m * group + 1 : group])
    rel = np.asarray(arm.error_ids, np.int64) - arm.first_id
    which = np.searchsorted(edges, rel, side="right") - 1
    counts = np.bincount(which[(which >= 0) & (which < m)], minlength=m).astype(np.float64)
    return np.asarray(counts / np.diff(edges), np.float64)


def _ceiling_bounds(
    arm: ArmSamples, f: np.ndarray | None, alpha: float, beta: float
) -> tuple[float, float]:
    """(lower, upper) bounds on this arm's failed share: on its time blocks' failed fractions
    with the long-run sd (valid when errors come in episodes: a bad period moves a few
    blocks, and a right-skewed series only makes this one-sided t test conservative), else on
    the count as independent coins."""
    if f is not None:
        if f.size < MIN_TEST_BLOCKS:
            # Too few blocks to weigh episodes: no confidence either way (never the coins,
            # which would read one bad period as many).
            return -math.inf, math.inf
        bt = level_test(f, alpha, beta, detrend=False)
        return bt.lower, bt.upper
    n, k = arm.requests, arm.error_count
    if n == 0:
        return -math.inf, math.inf
    lo = float(stats.beta.ppf(alpha, k, n - k + 1)) if k > 0 and alpha > 0 else 0.0
    hi = float(stats.beta.isf(beta, k + 1, n - k)) if beta > 0 and k < n else 1.0
    return lo, hi


def _error_test(
    s: ScenarioSamples, rho: float, policy: Policy, notes: list[str]
) -> tuple[float, dict[str, float]]:
    ref, cand = s.reference, s.candidate
    if ref.error_count + cand.error_count == 0:
        return 1.0, {}
    ev_r, ev_c = _events(ref), _events(cand)
    if ev_r is not None and ev_c is not None:
        ev_r = burst_events(ev_r[0], ev_r[1], policy.error_burst_s)
        ev_c = burst_events(ev_c[0], ev_c[1], policy.error_burst_s)
        times = np.concatenate([ev_r[0], ev_c[0]])
        labels = np.concatenate(
            [np.zeros(ev_r[0].size, dtype=np.int64), np.ones(ev_c[0].size, dtype=np.int64)]
        )
        kinds = ev_r[1] + ev_c[1]
        # Stable sort: simultaneous errors keep reference-first order, a fixed, data-free rule.
        order = np.argsort(times, kind="stable")
        result = kind_mixture_pvalues(
            labels[order],
            [kinds[i] for i in order],
            policy.error_kinds,
            rho=rho,
            kind_share=policy.error_kind_share,
        )
        return result.pvalue, result.kind_pvalues
    # Without the order, the Bayes factors at the final counts alone are still a valid p-value
    # (Markov's inequality at one fixed time), just without the sequential power.
    notes.append(
        f"Errors in {s.name}: error times do not match the error counts, so the count test "
        "used the final counts only."
    )
    labels_l: list[int] = []
    kinds_l: list[str] = []
    for label, arm in ((0, ref), (1, cand)):
        for kind, count in arm.errors.items():
            labels_l.extend([label] * count)
            kinds_l.extend([kind] * count)
    result = kind_mixture_pvalues(
        np.array(labels_l, dtype=np.int64),
        kinds_l,
        policy.error_kinds,
        rho=rho,
        kind_share=policy.error_kind_share,
        running=False,
    )
    return result.pvalue, result.kind_pvalues


def kinds_failed(kinds: Sequence[Check]) -> bool:
    return any(c.decision == "fail" for c in kinds)


def _kind_weight(policy: Policy) -> float:
    return policy.error_kind_share / (len(policy.error_kinds) + 1)


def _errors_check(
    s: ScenarioSamples,
    policy: Policy,
    decision: Decision,
    message: str,
    fractions: tuple[float, float] | None = None,
    check_alpha: float | None = None,
) -> Check:
    """The scenario's errors check itself (`error_check` adds the kinds and the environment)."""
    frac_r, frac_c = fractions if fractions is not None else (None, None)
    return statistic_check(
        f"{s.name}.errors",
        "errors",
        "errors",
        decision,
        message,
        scenario=s.name,
        **compared(frac_r, frac_c),
        threshold=policy.max_error_rate,
        samples=(s.reference.requests, s.candidate.requests),
        alpha=check_alpha,
    )


@dataclass(frozen=True)
class _ErrorEvidence:
    """What `error_check` found before deciding: the tests, the failed shares and the kinds."""

    p: float
    frac_r: float
    frac_c: float
    counts: str
    test: str
    count_alpha: float
    ceiling_alpha: float
    ref_over: bool
    over_ceiling: bool
    counted: bool
    block_more: bool
    more_by: float
    shown: float | None  # the upper bound of the block test at the look's levels, if any
    kinds: list[Check]
    driver: str | None
    several_kinds: bool
    extra: list[Check]


def _error_evidence(
    s: ScenarioSamples,
    alpha: float,
    policy: Policy,
    notes: list[str],
    planned: int | None,
    layout: Layout | None,
    looks: Sequence[int] | None,
) -> _ErrorEvidence:
    ref, cand = s.reference, s.candidate
    rho = cand.requests / (ref.requests + cand.requests)
    p, kind_p = _error_test(s, rho, policy, notes)
    frac_r = ref.error_count / ref.requests
    frac_c = cand.error_count / cand.requests
    counts = (
        f"{_arm_errors('candidate', cand, True)} vs "
        f"{_arm_errors('reference', ref, False)} in {ref.requests}"
    )
    # A quarter each: the count test on episodes, the block test on failed fractions, and
    # the two ceiling tests (candidate, reference).
    count_alpha, ceiling_alpha = alpha / 4.0, alpha / 4.0
    ceiling = policy.max_error_rate
    n = min(ref.requests, cand.requests)
    if layout is None:
        layout = Layout.build(max(n, 1))
    size, a_k, b_k = look_levels(
        n, tuple(looks) if looks else (max(n, 1),), ceiling_alpha, policy.beta
    )
    f_r, f_c = _fractions(ref, layout, size), _fractions(cand, layout, size)
    g_r = _fractions(ref, layout, size, CEILING_GROUP)
    g_c = _fractions(cand, layout, size, CEILING_GROUP)
    cand_lo, _ = _ceiling_bounds(cand, g_c, a_k, b_k)
    ref_lo, _ = _ceiling_bounds(ref, g_r, a_k, b_k)
    cand_over = cand_lo > ceiling
    ref_over = ref_lo > ceiling
    environment = _environment_check(s, ref, ceiling) if ref_over else None
    # The count test sees episodes; a hold also needs the candidate's failed share of requests
    # above the reference's, so bursts on the reference never make the candidate look worse
    # (a subset of a valid rejection region is valid).
    counted = p <= count_alpha and frac_c > frac_r
    # Block for block over the plan's time blocks: an engine that fails all the time is one
    # long episode to the count test, but many blocks of a higher failed fraction.
    _, d_a, d_b = look_levels(n, tuple(looks) if looks else (max(n, 1),), alpha / 4.0, policy.beta)
    block_more, more_by = _block_test(f_r, f_c, d_a, d_b, frac_c > frac_r)
    shown = None
    if (
        planned is not None
        and not (counted or block_more or (cand_over and not ref_over))
        and f_r is not None
        and f_c is not None
        and f_r.size == f_c.size
        and f_r.size >= MIN_TEST_BLOCKS
    ):
        shown = level_test(f_c - f_r, a_k, b_k, detrend=False).upper
    kinds = _kind_checks(s, count_alpha, policy, kind_p, final=planned is None)
    return _ErrorEvidence(
        p=p,
        frac_r=frac_r,
        frac_c=frac_c,
        counts=counts,
        test=f"{fmt_p(p)} (alpha {count_alpha:.2g})",
        count_alpha=count_alpha,
        ceiling_alpha=ceiling_alpha,
        ref_over=ref_over,
        over_ceiling=cand_over and not ref_over,
        counted=counted,
        block_more=block_more,
        more_by=more_by,
        shown=shown,
        kinds=kinds,
        driver=min(kind_p.items(), key=lambda kv: (kv[1], kv[0]))[0] if kind_p else None,
        several_kinds=len(kind_p) > 1,
        extra=[environment] if environment is not None else [],
    )


def _block_test(
    f_r: np.ndarray | None, f_c: np.ndarray | None, d_a: float, d_b: float, more_share: bool
) -> tuple[bool, float]:
    """Whether the candidate fails more block for block over time, and by how much at least
    (more_share: its failed share of requests is above the reference's)."""
    if (
        f_r is not None
        and f_c is not None
        and f_r.size == f_c.size >= MIN_TEST_BLOCKS
        # Only where the candidate fails in most blocks (DENSE_ERRORS): an engine that fails
        # all the time, one long episode to the count test. Sparse errors and bad periods
        # are the count test's (an episode is one event there); a t test on mostly-zero
        # differences, or on a few blocks of one bad period, is not valid at this alpha.
        and float(np.mean(f_c > 0.0)) >= DENSE_ERRORS
    ):
        diff = level_test(f_c - f_r, d_a, d_b, detrend=False)
        return diff.lower > 0.0 and more_share, diff.lower
    return False, 0.0


def error_check(
    s: ScenarioSamples,
    alpha: float,
    policy: Policy,
    notes: list[str],
    planned: int | None = None,
    layout: Layout | None = None,
    looks: Sequence[int] | None = None,
) -> list[Check]:
    """The scenario's errors check, then one check per error kind when several kinds occurred.

    planned: the scenario's planned requests per arm when this is a look before its end (see
    the module docstring for what a look may decide); None at the end. layout, looks: the
    plan's time blocks and looks of the scenario (None: one look at the samples held, blocks
    of equal request counts).
    """
    ref, cand = s.reference, s.candidate
    if ref.requests == 0 or cand.requests == 0:
        empty = "the candidate" if cand.requests == 0 else "the reference"
        return [
            _errors_check(
                s,
                policy,
                "undecided",
                f"Errors in {s.name} cannot be compared: {empty} served no requests.",
            )
        ]
    e = _error_evidence(s, alpha, policy, notes, planned, layout, looks)
    if e.counted or e.block_more or e.over_ceiling:
        return _errors_worse(s, alpha, policy, e)
    if planned is not None:
        return _errors_at_a_look(s, alpha, policy, e)
    return _errors_not_worse(s, alpha, policy, e)


def _errors_at_a_look(
    s: ScenarioSamples, alpha: float, policy: Policy, e: _ErrorEvidence
) -> list[Check]:
    """Before the end a clean scenario may stop early when its errors give no evidence of a
    regression and the candidate's failed share so far is within error_tolerance of the
    reference's and under the ceiling (the point figures: with errors in episodes, no bound on
    a difference of fractions gets that narrow in a few thousand requests). The bound over the
    time blocks is said when known."""
    frac_r, frac_c, ceiling = e.frac_r, e.frac_c, policy.max_error_rate
    within = (
        frac_c <= frac_r + policy.error_tolerance
        and (frac_c <= ceiling or e.ref_over)
        and not kinds_failed(e.kinds)
    )
    if within:
        bound = f" (at most {e.shown:+.2%} with confidence)" if e.shown is not None else ""
        return [
            _errors_check(
                s,
                policy,
                "pass",
                f"Errors in {s.name} so far: {e.counts}; {e.test}; no evidence of more "
                f"errors, and the candidate fails {frac_c - frac_r:+.2%} of its "
                f"requests against the reference{bound}, within the "
                f"{policy.error_tolerance:.2%} tolerance and the {ceiling:.2%} ceiling.",
                (frac_r, frac_c),
                alpha,
            ),
            *[replace(k, decision="pass") if k.decision == "undecided" else k for k in e.kinds],
            *e.extra,
        ]
    return [
        _errors_check(
            s,
            policy,
            "undecided",
            f"Errors in {s.name} so far: {e.counts}; {e.test}; no evidence yet of more "
            "errors, and not yet shown within tolerance.",
            (frac_r, frac_c),
            alpha,
        ),
        *e.kinds,
        *e.extra,
    ]


def _errors_not_worse(
    s: ScenarioSamples, alpha: float, policy: Policy, e: _ErrorEvidence
) -> list[Check]:
    """At the end, no evidence of more errors: a pass, or undecided above the ceiling."""
    frac_r, frac_c, ceiling = e.frac_r, e.frac_c, policy.max_error_rate
    if frac_c > ceiling and not e.ref_over:
        # Above the ceiling, but not with confidence at this size: neither shown broken
        # nor shown kept. Undecided, and like an undecided latency check it holds only on
        # evidence; the verdict keeps it in view.
        undecided = _errors_check(
            s,
            policy,
            "undecided",
            f"Errors in {s.name}: {e.counts}; {e.test}; the candidate's error rate {frac_c:.2%} "
            f"is above the {ceiling:.2%} ceiling but not with confidence at "
            f"{s.candidate.requests} requests (alpha {e.ceiling_alpha:.2g}).",
            (frac_r, frac_c),
            alpha,
        )
        both = " (the reference's too: the test bed may be unhealthy)" if frac_r > ceiling else ""
        warning = (
            f"the candidate fails {frac_c:.2%} of requests in {s.name}, above the "
            f"{ceiling:.2%} ceiling, not with confidence{both}"
        )
        return [replace(undecided, required=False, warning=warning), *e.kinds, *e.extra]
    rate = (
        f"an error rate of {frac_c:.2%}, within the {ceiling:.2%} ceiling"
        if not e.ref_over
        else "the ceiling not judged, since the reference breaks it too"
    )
    return [
        _errors_check(
            s,
            policy,
            "pass",
            f"Errors in {s.name}: {e.counts}; {e.test} and {rate}.",
            (frac_r, frac_c),
            alpha,
        ),
        *e.kinds,
        *e.extra,
    ]


def _errors_worse(
    s: ScenarioSamples, alpha: float, policy: Policy, e: _ErrorEvidence
) -> list[Check]:
    """More errors on the candidate, by the count test, the block test or the ceiling."""
    why = []
    if e.counted:
        more = f", mostly {e.driver}" if e.driver is not None and e.several_kinds else ""
        why.append(f"{fmt_p(e.p)} is at or below alpha {e.count_alpha:.2g}{more}")
    if e.block_more:
        why.append(
            f"block for block over time the candidate fails at least {e.more_by:.2%} more of "
            f"its requests (alpha {alpha / 4.0:.2g})"
        )
    if e.over_ceiling:
        why.append(
            f"the candidate's error rate {e.frac_c:.2%} is above the "
            f"{policy.max_error_rate:.2%} ceiling with confidence (alpha {e.ceiling_alpha:.2g})"
        )
    return [
        _errors_check(
            s,
            policy,
            "fail",
            f"Errors in {s.name}: {e.counts}; {' and '.join(why)}.",
            (e.frac_r, e.frac_c),
            alpha,
        ),
        *e.kinds,
        *e.extra,
    ]


def _environment_check(s: ScenarioSamples, ref: ArmSamples, ceiling: float) -> Check:
    """The reference itself fails above the ceiling: the test bed, not the candidate."""
    frac = ref.error_count / ref.requests
    kinds = _kinds(ref.errors)
    return statistic_check(
        ENVIRONMENT,
        "errors",
        "environment",
        "undecided",
        f"The reference fails {frac:.1%} of requests in {s.name} ({kinds}), above the "
        f"{ceiling:.2%} ceiling with confidence: the test bed, not the candidate, is "
        "unhealthy, so the gate cannot judge the candidate's errors here.",
        scenario=s.name,
        reference=frac,
        threshold=ceiling,
        samples=(ref.requests, 0),
    )


def _kind_checks(
    s: ScenarioSamples,
    alpha: float,
    policy: Policy,
    kind_p: Mapping[str, float],
    final: bool = True,
) -> list[Check]:
    """One check per kind when several kinds occurred: which kind the candidate has too many of.

    Each is implied by the scenario's mixture test (module docstring of counts.py), so it
    spends no budget of its own; its alpha is its weight's share, for the record. Before the
    scenario's end a kind without evidence is not yet decided, like the scenario's check.
    """
    if len(kind_p) < 2:
        return []
    weight = _kind_weight(policy)
    out = []
    for kind, p in sorted(kind_p.items()):
        n_r = _count(s.reference.errors, kind, policy)
        n_c = _count(s.candidate.errors, kind, policy)
        more = n_c / s.candidate.requests > n_r / s.reference.requests
        failed = p <= alpha and more
        verdict = "more than the reference can explain" if failed else "no evidence of more"
        decision: Decision = "fail" if failed else "pass" if final else "undecided"
        out.append(
            statistic_check(
                f"{s.name}.errors.{kind}",
                "errors",
                f"errors.{kind}",
                decision,
                f"{kind} errors in {s.name}: candidate {n_c} vs reference {n_r}; "
                f"{fmt_p(p)} (alpha {alpha:.2g}): {verdict}.",
                scenario=s.name,
                reference=n_r / s.reference.requests if s.reference.requests else None,
                candidate=n_c / s.candidate.requests if s.candidate.requests else None,
                samples=(s.reference.requests, s.candidate.requests),
                alpha=alpha * weight,
            )
        )
    return out


def _count(errors: Mapping[str, int], kind: str, policy: Policy) -> int:
    if kind == "other":
        return sum(n for k, n in errors.items() if k not in policy.error_kinds)
    return int(errors.get(kind, 0))


def error_checks(
    scenarios: Sequence[ScenarioSamples],
    policy: Policy,
    notes: list[str],
    alpha: float | None = None,
    planned: Mapping[str, int] | None = None,
    plan: Plan | None = None,
) -> list[Check]:
    """Errors of every scenario; alpha per scenario defaults to an even split of the budget
    over the comparable scenarios (the one-shot judge); a plan gives it, its time blocks and
    its looks instead."""
    if alpha is None:
        comparable = sum(1 for s in scenarios if s.reference.requests and s.candidate.requests)
        alpha = policy.group_alpha("errors") / comparable if comparable else 0.0
    out: list[Check] = []
    environment: list[Check] = []
    for s in scenarios:
        limit = None if planned is None else planned.get(s.name)
        layout = looks = None
        if plan is not None and s.name in plan.requests:
            layout, looks = plan.layout(s.name), plan.look_sizes(s.name)
        for c in error_check(s, alpha, policy, notes, limit, layout, looks):
            (environment if c.id == ENVIRONMENT else out).append(c)
    if len(environment) == 1:
        out.append(environment[0])
    elif environment:
        # One check for the gate: the test bed is one, however many scenarios showed it.
        first = environment[0]
        out.append(
            replace(
                first,
                scenario=None,
                message=" ".join(c.message for c in environment),
                samples=(sum(c.samples[0] for c in environment), 0),
            )
        )
    return out


def outputs_checks(scenarios: Sequence[ScenarioSamples]) -> list[Check]:
    """Hard holds on NaN/infinite logprobs and empty outputs, where any were counted."""
    out: list[Check] = []
    for s in scenarios:
        ref, cand = s.reference, s.candidate
        counts = (ref.nan_logprobs, ref.empty_outputs, cand.nan_logprobs, cand.empty_outputs)
        if not any(counts):
            continue

        def what(arm: ArmSamples) -> str:
            parts = []
            if arm.nan_logprobs:
                parts.append(f"{arm.nan_logprobs} with NaN or infinite logprobs")
            if arm.empty_outputs:
                parts.append(f"{arm.empty_outputs} without a single token")
            return " and ".join(parts)

        if cand.nan_logprobs or cand.empty_outputs:
            message = (
                f"The candidate returned broken responses in {s.name}: {what(cand)}; a "
                "numerically broken engine is held whatever its latency."
            )
        else:
            message = (
                f"The reference returned broken responses in {s.name} ({what(ref)}), so the "
                "comparison is void; the gate holds rather than judge against a broken baseline."
            )
        bad_r = ref.nan_logprobs + ref.empty_outputs
        bad_c = cand.nan_logprobs + cand.empty_outputs
        out.append(
            rule_check(
                f"{s.name}.outputs",
                "correctness",
                "outputs",
                "fail",
                message,
                scenario=s.name,
                reference=float(bad_r),
                candidate=float(bad_c),
                threshold=0.0,
                samples=(ref.requests, cand.requests),
            )
        )
    return out
