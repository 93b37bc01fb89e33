"""The plan of a gate's statistical checks, fixed before any sample is seen.

References:
    S. R. Howard and A. Ramdas, "Sequential estimation of quantiles with applications to
    A/B-testing and best-arm identification", Bernoulli 28(3), 2022.
    S. R. Howard, A. Ramdas, J. McAuliffe and J. Sekhon, "Time-uniform, nonparametric,
    nonasymptotic confidence sequences", Annals of Statistics 49(2), 2021.

Why a plan: a confidence sequence is valid at every sample size at once only if nothing about
it depends on the data, and that includes the mixture's tuning (t_opt), the share of alpha each
check spends and the set of checks that share it. A judge that is asked once, at a scenario's
end, may tune all of these to the sample it holds; a gate that looks at growing prefixes and
stops on the first clear answer must fix them in advance, or each look would be a fresh test
and the false-hold rate would grow with the number of looks. The plan fixes them from what the
gate knows before the load starts: the policy and each scenario's planned requests per arm.

Per check: t_opt is the scenario's planned requests (the sample size at which the interval is
tightest is the one where an undecided check must finally be decided); the alpha is the latency
budget split evenly over the checks kept; with quantiles "auto", a quantile is kept when its
confidence sequence can be finite at the planned size (the same rule the one-shot judge applies
to the sizes it holds), and one kept that cannot be resolved at the planned size may fail but
becomes a note, not a hold, if it ends undecided. With all of that fixed, the sequences hold at
every prefix at once, so the gate may look whenever it likes (the policy's `look_every`
requests per arm is the cadence the calibration assumes) and the final judge, given the same
plan and samples, reproduces the last look exactly.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from gate.analysis.policy import Policy, quantile_key
from gate.analysis.sequences import count_bounds, min_samples_for_finite

__all__ = ["Plan", "PlannedCheck", "finite_at", "min_samples_resolving", "resolves"]

METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}


def finite_at(n: int, q: float, alpha_arm: float, t_opt: int | None = None) -> bool:
    """Whether n samples bound the q-quantile on both sides."""
    if n <= 0:
        return False
    k_lo, k_hi = count_bounds(n, q, alpha_arm, t_opt)
    return k_lo >= 1 and k_hi < n


def resolves(n: int, q: float, alpha_arm: float, t_opt: int | None = None) -> bool:
    """Whether n samples pin the q-quantile down usefully: the confidence sequence must lie
    within half the tail on each side (p99 between p98.5 and p99.5; p50 between p25 and p75).

    A CS that is merely finite at p99 reaches to the sample maximum, which decides nothing
    about a real engine and would turn every auto-checked gate of a thousand requests into an
    inconclusive hold. The rule depends on sample counts only, never on the latencies.
    """
    if n <= 0:
        return False
    half = (1.0 - q) / 2.0 if q >= 0.5 else q / 2.0
    k_lo, k_hi = count_bounds(n, q, alpha_arm, t_opt)
    return k_lo >= 1 and k_hi < n and k_lo / n >= q - half and (k_hi + 1) / n <= q + half


@lru_cache(maxsize=256)
def min_samples_resolving(q: float, alpha_arm: float) -> int:
    """Smallest n for which `resolves` holds (doubling, then bisection)."""
    hi = 8
    while not resolves(hi, q, alpha_arm):
        hi *= 2
        if hi > 1 << 30:
            return hi
    lo = hi // 2
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if resolves(mid, q, alpha_arm):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class PlannedCheck:
    """One latency check of the plan: everything about it that must not depend on the data.

    required: the check must be decided (a listed quantile, or an auto quantile the planned
    size resolves); an auto check that is not required becomes a note if it ends undecided
    while its samples cannot resolve it.
    """

    scenario: str
    metric: str
    q: float
    alpha: float
    t_opt: int
    required: bool

    @property
    def id(self) -> str:
        return f"{self.scenario}.{self.metric}.{quantile_key(self.q)}"


@dataclass(frozen=True)
class Plan:
    """Checks, alphas and tunings for a gate, from the policy and the planned requests.

    requests: per scenario, the planned requests per arm after the warm-up (every check is
    tuned to decide there); limits: per scenario, the most requests per arm it may run when
    extended (policy `extend`; the planned size for a scenario that cannot be extended);
    error_alpha: each scenario's share of the errors budget; tail_alpha: each tail check's
    share of the tail budget (one check per scenario x metric, tail.py), whose bets are tuned
    to the scenario's planned requests.
    """

    policy: Policy
    requests: Mapping[str, int]
    latency: tuple[PlannedCheck, ...]
    error_alpha: float
    notes: tuple[str, ...]
    tail_alpha: float = 0.0
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
        """Plan every scenario x metric x quantile check for the planned sample sizes.

        extendable: the scenarios that may run past their planned size when undecided (policy
        `extend`); None: all of them.
        """
        for name, n in requests.items():
            if n < 1:
                raise ValueError(f"scenario {name!r}: planned requests must be >= 1, got {n}")
        auto = policy.quantiles == "auto"
        quantiles = policy.checked_quantiles
        group_alpha = policy.group_alpha("latency")
        wanted = [(s, m, q) for s in requests for m in policy.metrics for q in quantiles]
        notes: list[str] = []
        kept = wanted
        if auto and wanted:
            plan_arm = group_alpha / len(wanted) / 2.0
            kept = []
            for s, m, q in wanted:
                n = int(requests[s])
                if finite_at(n, q, plan_arm, n) or q == quantiles[0]:
                    # The lowest quantile is always planned: if even it cannot be bounded the
                    # judge says so with an inconclusive check rather than a silent skip.
                    kept.append((s, m, q))
                else:
                    need = min_samples_for_finite(q, plan_arm)
                    notes.append(
                        f"{METRIC_LABEL[m]} {quantile_key(q)} not checked in {s}: {n} planned "
                        f"requests per arm bound it only from {need} on (raise the scenario's "
                        "requests)."
                    )
        alpha = group_alpha / len(kept) if kept else 0.0
        checks = tuple(
            PlannedCheck(
                scenario=s,
                metric=m,
                q=q,
                alpha=alpha,
                t_opt=int(requests[s]),
                required=(not auto)
                or q == quantiles[0]
                or resolves(int(requests[s]), q, alpha / 2.0, int(requests[s])),
            )
            for s, m, q in kept
        )
        if checks:
            notes.append(
                f"Latency budget {group_alpha:.4g} planned over {len(checks)} quantile checks: "
                f"{alpha:.4g} each, half per arm, looks every {policy.look_every} requests."
            )
        error_alpha = policy.group_alpha("errors") / len(requests) if requests else 0.0
        tails = len(requests) * len(policy.metrics)
        tail_alpha = policy.group_alpha("tail") / tails if tails else 0.0
        if tail_alpha > 0.0:
            notes.append(
                f"Tail budget {policy.group_alpha('tail'):.4g} planned over {tails} tail "
                f"checks: {tail_alpha:.4g} each."
            )
        limits = {
            s: int(n)
            + (math.ceil(int(n) * policy.extend) if extendable is None or s in extendable else 0)
            for s, n in requests.items()
        }
        return cls(
            policy=policy,
            requests=MappingProxyType(dict(requests)),
            limits=MappingProxyType(limits),
            latency=checks,
            error_alpha=error_alpha,
            notes=tuple(notes),
            tail_alpha=tail_alpha,
        )

    def checks_for(self, scenario: str) -> tuple[PlannedCheck, ...]:
        return tuple(c for c in self.latency if c.scenario == scenario)
