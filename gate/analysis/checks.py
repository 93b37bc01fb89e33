"""Constructors of the recurring shapes of a Check, so each site names only the fields it sets.

Every field a shape does not take, or a site does not give, is None (samples: (0, 0)); the
result is a plain Check, the same as one spelled out in full.

rule_check: a deterministic rule, no interval and no alpha (crash, compatibility, broken
    outputs, startup by a single launch, recovery, latency coverage).
statistic_check: decided by a test that spends alpha (errors, startup phases over several
    launches, divergence, whose hard rules share its shape with alpha None), with the
    anytime-valid interval of the candidate-minus-reference difference where there is one
    (goodput, collapse).
ratio_check: a paired latency check on the candidate/reference ratio of a quantile or of the
    tail, with its role (required) and what it could detect.
quotient: the ratio reported beside two values that are not a ratio themselves; compared: the
    two values and that ratio, as a check's fields.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict, Unpack

from gate.analysis.types import Check, CheckGroup, Decision

__all__ = ["compared", "quotient", "ratio_check", "rule_check", "statistic_check"]


def quotient(reference: float | None, candidate: float | None) -> float | None:
    """candidate / reference, or None when either is unknown or the reference is zero."""
    return candidate / reference if reference and candidate is not None else None


class Compared(TypedDict):
    """Two observed values and the ratio reported beside them."""

    reference: float | None
    candidate: float | None
    ratio: float | None


def compared(reference: float | None, candidate: float | None) -> Compared:
    """The fields of a check that reports both values with their `quotient`."""
    return Compared(reference=reference, candidate=candidate, ratio=quotient(reference, candidate))


class RuleFields(TypedDict, total=False):
    """What a deterministic rule may report beside its decision: `statistic_check`'s fields
    less the interval and alpha, which a rule never has."""

    scenario: str | None
    reference: float | None
    candidate: float | None
    ratio: float | None
    threshold: float | None
    samples: tuple[int, int]


def rule_check(
    id: str,
    group: CheckGroup,
    metric: str,
    decision: Decision,
    message: str,
    **fields: Unpack[RuleFields],
) -> Check:
    """A deterministic rule: what was observed and the limit, no interval and no alpha."""
    return statistic_check(id, group, metric, decision, message, **fields)


def statistic_check(
    id: str,
    group: CheckGroup,
    metric: str,
    decision: Decision,
    message: str,
    *,
    scenario: str | None = None,
    reference: float | None = None,
    candidate: float | None = None,
    ratio: float | None = None,
    interval: tuple[float, float] | None = None,
    threshold: float | None = None,
    samples: tuple[int, int] = (0, 0),
    alpha: float | None = None,
) -> Check:
    """A statistical test; alpha is its share of the budget (None where it got none)."""
    return Check(
        id=id,
        group=group,
        scenario=scenario,
        metric=metric,
        quantile=None,
        reference=reference,
        candidate=candidate,
        ratio=ratio,
        interval=interval,
        threshold=threshold,
        decision=decision,
        samples=samples,
        alpha=alpha,
        message=message,
    )


def ratio_check(
    id: str,
    metric: str,
    decision: Decision,
    message: str,
    *,
    scenario: str,
    threshold: float,
    samples: tuple[int, int],
    quantile: float | None = None,
    reference: float | None = None,
    candidate: float | None = None,
    ratio: float | None = None,
    interval: tuple[float, float] | None = None,
    alpha: float | None = None,
    estimate_interval: tuple[float, float] | None = None,
    required: bool = True,
    detectable: float | None = None,
    correlation_requests: float | None = None,
    block_requests: int | None = None,
) -> Check:
    """A latency check of a scenario; the estimates stay None when it could not be computed."""
    check = statistic_check(
        id,
        "latency",
        metric,
        decision,
        message,
        scenario=scenario,
        reference=reference,
        candidate=candidate,
        ratio=ratio,
        interval=interval,
        threshold=threshold,
        samples=samples,
        alpha=alpha,
    )
    return replace(
        check,
        quantile=quantile,
        estimate_interval=estimate_interval,
        required=required,
        detectable=detectable,
        correlation_requests=correlation_requests,
        block_requests=block_requests,
    )
