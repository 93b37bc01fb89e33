"""The plan of a gate's statistical checks, fixed before any sample is seen.

References:
    T. L. Lai, "On confidence sequences", Annals of Statistics 4(2), 1976.
    M. F. Perez-Ortiz, T. Lardy, R. de Heide and P. Grunwald, "E-statistics, group invariance
    and anytime valid testing", Annals of Statistics 52(4), 2024.

Why a plan: a confidence sequence is valid at every sample size at once only if nothing about
it depends on the data: the block length, the prior scale of the t test, the share of alpha
each check spends and the set of checks that share it. The plan fixes all of them from what
the gate knows before the load starts, the policy and each scenario's planned requests per
engine, so the gate may look at growing prefixes as often as it likes and stop on the first
clear answer, and the final judge, given the same plan and samples, reproduces the last look.

Per scenario and metric, the plan has one paired check per quantile (auto: p50 and p90) and
one tail check (paired.py). Every check has the same role at every size: it holds on
evidence of a regression, and an undecided one holds only when the policy's `require` lists
it. There is no size at which a check becomes required or is dropped, so the same engines get
the same kind of verdict at 500 and at 800 requests. The block length is
`block_length(planned)`; the prior scale is tuned to the planned number of blocks; the alpha is
the latency budget split evenly over the quantile checks and the tail budget over the tail
checks. Only a scenario with a required check may run past its plan (policy `extend`).

Before the load the plan says, per check, the smallest regression it can detect with 80% power
at the planned size under the policy's `noise` assumption, and for each `detect` entry the
planned size that would catch it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gate.analysis.paired import (
    MIN_BLOCKS,
    block_for,
    block_length,
    planned_shift,
    size_to_detect,
    tune_g,
)
from gate.analysis.policy import Policy, check_key, quantile_key

__all__ = ["METRIC_LABEL", "Plan", "PlannedCheck", "tolerance_of"]

METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}


def tolerance_of(policy: Policy, q: float | None) -> float:
    """The allowed relative increase of a quantile check, or of the tail (q None)."""
    return policy.tail.tolerance if q is None else policy.tolerance_for(q)


def _pct(x: float) -> str:
    if not math.isfinite(x):
        return "nothing yet (too few blocks for its alpha)"
    return f"+{x:.0%}" if x >= 0.1 else f"+{x:.1%}"


@dataclass(frozen=True)
class PlannedCheck:
    """One paired check of the plan: everything about it that must not depend on the data.

    q: the quantile, or None for the tail check; block: requests per block; g: the t test's
    prior scale, tuned to the planned number of blocks; required: an undecided result holds.
    """

    scenario: str
    metric: str
    q: float | None
    alpha: float
    block: int
    g: float
    required: bool

    @property
    def key(self) -> str:
        return check_key(self.metric, self.q)

    @property
    def id(self) -> str:
        return f"{self.scenario}.{self.key}"

    @property
    def label(self) -> str:
        what = "tail" if self.q is None else quantile_key(self.q)
        return f"{METRIC_LABEL[self.metric]} {what}"


@dataclass(frozen=True)
class Plan:
    """Checks, alphas and tunings for a gate, from the policy and the planned requests.

    requests: per scenario, the planned requests per engine after the warm-up; limits: per
    scenario, the most requests it may run when a required check is undecided at the plan
    (policy `extend`); error_alpha: each scenario's share of the errors budget.
    """

    policy: Policy
    requests: Mapping[str, int]
    latency: tuple[PlannedCheck, ...]
    error_alpha: float
    notes: tuple[str, ...]
    tails: tuple[PlannedCheck, ...] = ()
    limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def limit(self, scenario: str) -> int:
        return int(self.limits.get(scenario, self.requests[scenario]))

    @classmethod
    def build(
        cls,
        policy: Policy,
        requests: Mapping[str, int],
        extendable: Collection[str] | None = None,
    ) -> Plan:
        """Plan every scenario x metric x (quantile, tail) check for the planned sizes.

        extendable: the scenarios that may run past their planned size when a required check
        is undecided (policy `extend`); None: all of them.
        """
        for name, n in requests.items():
            if n < 1:
                raise ValueError(f"scenario {name!r}: planned requests must be >= 1, got {n}")
        quantiles = policy.checked_quantiles
        n_latency = len(requests) * len(policy.metrics) * len(quantiles)
        lat_alpha = policy.group_alpha("latency") / n_latency if n_latency else 0.0
        n_tails = len(requests) * len(policy.metrics)
        tail_alpha = policy.group_alpha("tail") / n_tails if n_tails else 0.0

        def planned(s: str, m: str, q: float | None, alpha: float) -> PlannedCheck:
            n = int(requests[s])
            block = block_for(n, q, policy.tail.start)
            return PlannedCheck(
                scenario=s,
                metric=m,
                q=q,
                alpha=alpha,
                block=block,
                g=tune_g(n // block, alpha),
                required=policy.requires(m, q),
            )

        latency = tuple(
            planned(s, m, q, lat_alpha) for s in requests for m in policy.metrics for q in quantiles
        )
        tails = (
            tuple(planned(s, m, None, tail_alpha) for s in requests for m in policy.metrics)
            if tail_alpha > 0.0
            else ()
        )
        notes = [
            f"Latency budget {policy.group_alpha('latency'):.4g} planned over {len(latency)} "
            f"paired quantile checks: {lat_alpha:.4g} each; looks every {policy.look_every} "
            "requests."
        ]
        if tails:
            notes.append(
                f"Tail budget {policy.group_alpha('tail'):.4g} planned over {len(tails)} tail "
                f"checks: {tail_alpha:.4g} each."
            )
        else:
            notes.append("Tail checks off: alpha_split gives tail no budget.")
        for s, n in requests.items():
            notes.append(_detect_note(policy, s, int(n), latency + tails))
        required = {c.scenario for c in latency + tails if c.required}
        limits = {
            s: int(n)
            + (
                math.ceil(int(n) * policy.extend)
                if s in required and (extendable is None or s in extendable)
                else 0
            )
            for s, n in requests.items()
        }
        return cls(
            policy=policy,
            requests=MappingProxyType(dict(requests)),
            limits=MappingProxyType(limits),
            latency=latency,
            tails=tails,
            error_alpha=policy.group_alpha("errors") / len(requests) if requests else 0.0,
            notes=tuple(notes),
        )

    def checks_for(self, scenario: str) -> tuple[PlannedCheck, ...]:
        """The scenario's quantile checks, then its tail checks."""
        return tuple(c for c in self.latency + self.tails if c.scenario == scenario)


def _detect_note(policy: Policy, scenario: str, n: int, checks: tuple[PlannedCheck, ...]) -> str:
    """What each of the scenario's checks can detect at its planned size, and what `detect`
    asks for."""
    mine = [c for c in checks if c.scenario == scenario]
    block = block_length(n)
    if n // block < MIN_BLOCKS:
        return (
            f"{scenario}: {n} planned requests per engine make {n // block} blocks of {block}; "
            f"the paired checks need {MIN_BLOCKS} ({MIN_BLOCKS * block} requests), so latency "
            "cannot be compared and the gate will hold (raise the scenario's requests)."
        )
    parts = []
    for c in mine:
        tol = tolerance_of(policy, c.q)
        shift = planned_shift(n, c.q, policy.noise, c.alpha, policy.tail.start)
        detect = math.exp(math.log1p(tol) + shift) - 1.0
        longer = f" (blocks of {c.block})" if c.block != block else ""
        parts.append(f"{c.label} {_pct(detect)}{longer}")
    text = (
        f"{scenario}: {n} planned requests per engine in {n // block} blocks of {block}; with "
        f"80% power it can detect {', '.join(parts)} (assuming a pair's log ratio has sd "
        f"{policy.noise:g}; the checks measure it)."
    )
    asks = []
    for c in mine:
        want = policy.detect_for(c.metric, c.q)
        if want is None:
            continue
        need = size_to_detect(
            want, c.q, policy.noise, c.alpha, tolerance_of(policy, c.q), policy.tail.start
        )
        if need is None:
            asks.append(f"{c.label} +{want:.0%} cannot be detected above its tolerance")
        else:
            verdict = "planned" if need <= n else f"raise requests to {need}"
            asks.append(f"{c.label} +{want:.0%} needs {need} per engine ({verdict})")
    if asks:
        text += " Policy detect: " + "; ".join(asks) + "."
    return text
