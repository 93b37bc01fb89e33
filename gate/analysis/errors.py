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
error rate is above it with confidence, by an anytime-valid e-process (counts.
log_ceiling_evalue), so an engine at the ceiling is held at most alpha of the time at any look.
The same test on the reference says when the test bed itself is unhealthy: a reference above
the ceiling with confidence makes a `gate.environment` check that holds and names the
environment, and the candidate's rate above the ceiling is then not counted against it (the
count test still compares the two). The scenario's errors alpha is split: half to the count
test, a quarter to each ceiling test.

The count test can reject but never accept, so before the planned end an errors check is either
failed or not yet decided: a clean scenario runs to its limit (a rare new error kind shows late,
and stopping early would only hide it).

A response with a NaN or infinite logprob, or a successful response without a token, is a broken
engine: `outputs_checks` holds on it without statistics (no alpha).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from gate.analysis.checks import quotient, rule_check, statistic_check
from gate.analysis.counts import (
    block_fractions,
    kind_mixture_pvalues,
    log_ceiling_capital,
    log_ceiling_evalue,
)
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
    """One arm's errors as events: an event opens at an error and takes every error of the
    arm sent less than `window_s` after that first one (windows do not chain, so errors that
    never stop are one event per window, not one in all). Each event is at its first error's
    time, of its kind."""
    if times.size == 0 or window_s <= 0.0:
        return times, list(kinds)
    order = np.argsort(times, kind="stable")
    t = times[order]
    first: list[int] = []
    opened = -math.inf
    for i, ti in enumerate(t):
        if ti - opened >= window_s:
            first.append(i)
            opened = float(ti)
    picked = order[np.asarray(first, np.int64)]
    return times[picked], [kinds[i] for i in picked]


ENVIRONMENT = "gate.environment"
CEILING_BLOCK = 32  # requests per block of the ceiling test: fixed, like the latency blocks


def _ceiling_log_e(arm: ArmSamples, ceiling: float) -> float:
    """Evidence that this arm fails more than `ceiling` of its requests (counts.py): on the
    failed fraction of each block of requests when the errors' schedule ids are known (valid
    under bursts), else on the count (independent errors assumed)."""
    if arm.error_ids is not None:
        f = block_fractions(arm.error_ids, arm.first_id, arm.requests, CEILING_BLOCK)
        return log_ceiling_capital(f, ceiling)
    return log_ceiling_evalue(arm.error_count, arm.requests, ceiling)


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


def _kind_weight(policy: Policy) -> float:
    return policy.error_kind_share / (len(policy.error_kinds) + 1)


def error_check(
    s: ScenarioSamples,
    alpha: float,
    policy: Policy,
    notes: list[str],
    planned: int | None = None,
) -> list[Check]:
    """The scenario's errors check, then one check per error kind when several kinds occurred.

    planned: the scenario's planned requests per arm when this is a look before its end (see
    the module docstring for what a look may decide); None at the end.
    """
    ref, cand = s.reference, s.candidate

    def check(
        decision: Decision,
        message: str,
        fractions: tuple[float, float] | None = None,
        check_alpha: float | None = None,
    ) -> Check:
        frac_r, frac_c = fractions if fractions is not None else (None, None)
        return statistic_check(
            f"{s.name}.errors",
            "errors",
            "errors",
            decision,
            message,
            scenario=s.name,
            reference=frac_r,
            candidate=frac_c,
            ratio=quotient(frac_r, frac_c),
            threshold=policy.max_error_rate,
            samples=(ref.requests, cand.requests),
            alpha=check_alpha,
        )

    if ref.requests == 0 or cand.requests == 0:
        empty = "the candidate" if cand.requests == 0 else "the reference"
        return [
            check(
                "undecided",
                f"Errors in {s.name} cannot be compared: {empty} served no requests.",
            )
        ]
    rho = cand.requests / (ref.requests + cand.requests)
    p, kind_p = _error_test(s, rho, policy, notes)
    frac_r = ref.error_count / ref.requests
    frac_c = cand.error_count / cand.requests
    counts = (
        f"{_arm_errors('candidate', cand, True)} vs "
        f"{_arm_errors('reference', ref, False)} in {ref.requests}"
    )
    count_alpha, ceiling_alpha = alpha / 2.0, alpha / 4.0
    ceiling = policy.max_error_rate
    bar = math.log(1.0 / ceiling_alpha) if ceiling_alpha > 0.0 else math.inf
    cand_over = _ceiling_log_e(cand, ceiling) >= bar
    ref_over = _ceiling_log_e(ref, ceiling) >= bar
    environment = _environment_check(s, ref, ceiling) if ref_over else None
    over_ceiling = cand_over and not ref_over
    # The count test sees events; a hold also needs the candidate's failed share of requests
    # above the reference's, so bursts on the reference never make the candidate look worse
    # (a subset of a valid rejection region is valid).
    significant = p <= count_alpha and frac_c > frac_r
    kinds = _kind_checks(s, count_alpha, policy, kind_p, final=planned is None)
    driver = min(kind_p.items(), key=lambda kv: (kv[1], kv[0]))[0] if kind_p else None
    extra = [environment] if environment is not None else []
    test = f"{fmt_p(p)} (alpha {count_alpha:.2g})"
    if not (significant or over_ceiling):
        if planned is not None:
            return [
                check(
                    "undecided",
                    f"Errors in {s.name} so far: {counts}; {test}; no evidence yet, and the "
                    "count test decides only on evidence or at the planned end.",
                    (frac_r, frac_c),
                    alpha,
                ),
                *kinds,
                *extra,
            ]
        if frac_c > ceiling and not ref_over:
            # Above the ceiling, but not with confidence at this size: neither shown broken
            # nor shown kept. Undecided, and like an undecided latency check it holds only on
            # evidence; the verdict keeps it in view.
            undecided = check(
                "undecided",
                f"Errors in {s.name}: {counts}; {test}; the candidate's error rate {frac_c:.2%} "
                f"is above the {ceiling:.2%} ceiling but not with confidence at "
                f"{cand.requests} requests (alpha {ceiling_alpha:.2g}).",
                (frac_r, frac_c),
                alpha,
            )
            return [replace(undecided, required=False), *kinds, *extra]
        rate = (
            f"an error rate of {frac_c:.2%}, within the {ceiling:.2%} ceiling"
            if not ref_over
            else "the ceiling not judged, since the reference breaks it too"
        )
        return [
            check(
                "pass",
                f"Errors in {s.name}: {counts}; {test} and {rate}.",
                (frac_r, frac_c),
                alpha,
            ),
            *kinds,
            *extra,
        ]
    why = []
    if significant:
        more = f", mostly {driver}" if driver is not None and len(kind_p) > 1 else ""
        why.append(f"{fmt_p(p)} is at or below alpha {count_alpha:.2g}{more}")
    if over_ceiling:
        why.append(
            f"the candidate's error rate {frac_c:.2%} is above the {ceiling:.2%} ceiling with "
            f"confidence (alpha {ceiling_alpha:.2g})"
        )
    return [
        check(
            "fail", f"Errors in {s.name}: {counts}; {' and '.join(why)}.", (frac_r, frac_c), alpha
        ),
        *kinds,
        *extra,
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
) -> list[Check]:
    """Errors of every scenario; alpha per scenario defaults to an even split of the budget
    over the comparable scenarios (the one-shot judge); a plan gives it instead."""
    if alpha is None:
        comparable = sum(1 for s in scenarios if s.reference.requests and s.candidate.requests)
        alpha = policy.group_alpha("errors") / comparable if comparable else 0.0
    out: list[Check] = []
    environment: list[Check] = []
    for s in scenarios:
        limit = None if planned is None else planned.get(s.name)
        for c in error_check(s, alpha, policy, notes, limit):
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
