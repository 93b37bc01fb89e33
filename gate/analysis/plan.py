"""The plan of a gate's statistical checks, fixed before any sample is seen (judge v3).

References:
    K. K. G. Lan and D. L. DeMets, "Discrete sequential boundaries for clinical trials",
    Biometrika 70(3), 1983.

Why a plan: a test looked at repeatedly is valid only if nothing about it depends on the data:
the blocks, the looks, the share of alpha each check spends at each look, and the set of
checks that share it. The plan fixes all of them from what the gate knows before the load
starts: the policy, each scenario's planned requests per engine and, where the schedule gives
them, the requests' intended send offsets (blocks in time, paired.Layout).

Per scenario and metric, the plan has one paired check per quantile (auto: p50 and p90), a
window check (a slow run of blocks) and a creep check (a rising trend) in the latency budget,
and a tail check (exceedances over the slow tail) in the tail budget. Every check has the same
role at every size: it holds on evidence of a regression, and an undecided one holds only when
the policy's `require` lists it. The looks are every `look_every` requests per engine, plus the
planned size and the limit (policy `extend`); each check spends its alpha over them
(paired.look_levels), so the judge at the end, given the same plan and samples, reproduces the
last look.

Before the load the plan says, per check, the smallest regression it can detect with 80% power
at the planned size under the policy's `noise` assumption, and for each `detect` entry the
planned size that would catch it. A scenario too short to decide anything (fewer than
paired.MIN_BLOCKS blocks) is refused with the size it needs (`ShortScenario`), unless the policy
allows it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from gate.analysis.paired import (
    MIN_BLOCKS,
    Layout,
    planned_shift,
    size_to_detect,
)
from gate.analysis.policy import Policy, check_key, quantile_key
from gate.core.errors import ShortScenario

__all__ = [
    "METRIC_LABEL",
    "CheckKind",
    "Plan",
    "PlannedCheck",
    "ShortScenario",
    "tolerance_of",
]

METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}
CheckKind = Literal["quantile", "tail", "window", "creep"]


def tolerance_of(policy: Policy, q: float | None, kind: str = "quantile") -> float:
    """The allowed relative increase of a check."""
    if kind == "window":
        return policy.window_tolerance
    if kind == "creep":
        return policy.creep_tolerance
    return policy.tail.tolerance if q is None else policy.tolerance_for(q)


def _pct(x: float) -> str:
    if not math.isfinite(x):
        return "nothing yet (too few blocks for its alpha)"
    return f"+{x:.0%}" if x >= 0.1 else f"+{x:.1%}"


@dataclass(frozen=True)
class PlannedCheck:
    """One paired check of the plan: everything about it that must not depend on the data.

    kind: quantile (q set), tail, window or creep; alpha: the hold side's budget over all
    looks; beta: the pass side's; required: an undecided result holds."""

    scenario: str
    metric: str
    q: float | None
    alpha: float
    beta: float
    required: bool
    kind: CheckKind = "quantile"

    @property
    def key(self) -> str:
        return check_key(self.metric, self.q, self.kind)

    @property
    def id(self) -> str:
        return f"{self.scenario}.{self.key}"

    @property
    def label(self) -> str:
        what = self.kind if self.q is None else quantile_key(self.q)
        return f"{METRIC_LABEL[self.metric]} {what}"


@dataclass(frozen=True)
class Plan:
    """Checks, alphas, blocks and looks for a gate, from the policy and the planned requests.

    requests: per scenario, the planned requests per engine after the warm-up; limits: per
    scenario, the most requests it may run (policy `extend`); layouts: its blocks; looks: the
    sizes at which a look judges; error_alpha: each scenario's share of the errors budget.
    """

    policy: Policy
    requests: Mapping[str, int]
    latency: tuple[PlannedCheck, ...]
    error_alpha: float
    notes: tuple[str, ...]
    tails: tuple[PlannedCheck, ...] = ()
    limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    layouts: Mapping[str, Layout] = field(default_factory=lambda: MappingProxyType({}))
    looks: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def limit(self, scenario: str) -> int:
        return int(self.limits.get(scenario, self.requests[scenario]))

    def layout(self, scenario: str) -> Layout:
        got = self.layouts.get(scenario)
        if got is None:
            return Layout.build(self.requests[scenario], self.limit(scenario))
        return got

    def look_sizes(self, scenario: str) -> tuple[int, ...]:
        got = self.looks.get(scenario)
        if got is None:
            return _look_sizes(self.requests[scenario], self.limit(scenario), self.policy)
        return got

    @classmethod
    def build(
        cls,
        policy: Policy,
        requests: Mapping[str, int],
        extendable: Collection[str] | None = None,
        times: Mapping[str, Sequence[float] | np.ndarray] | None = None,
        short_ok: Collection[str] = (),
    ) -> Plan:
        """Plan every scenario x metric x check for the planned sizes.

        extendable: the scenarios that may run past their planned size when a required check
        is undecided (policy `extend`); None: all of them. times: per scenario, the intended
        send offsets of its judged requests (blocks in time). short_ok: scenarios allowed to
        be too short (beside policy.short_scenarios 'allow'); any other too-short scenario
        raises ShortScenario.
        """
        for name, n in requests.items():
            if n < 1:
                raise ValueError(f"scenario {name!r}: planned requests must be >= 1, got {n}")
        quantiles = policy.checked_quantiles
        kinds: list[tuple[float | None, CheckKind]] = [(q, "quantile") for q in quantiles]
        kinds += [(None, "window"), (None, "creep")]
        n_latency = len(requests) * len(policy.metrics) * len(kinds)
        lat_alpha = policy.group_alpha("latency") / n_latency if n_latency else 0.0
        n_tails = len(requests) * len(policy.metrics)
        tail_alpha = policy.group_alpha("tail") / n_tails if n_tails else 0.0

        limits = _limits(policy, requests, kinds, extendable)
        layouts = {
            s: Layout.build(int(n), limits[s], None if times is None else times.get(s))
            for s, n in requests.items()
        }
        looks = {s: _look_sizes(int(n), limits[s], policy) for s, n in requests.items()}
        _refuse_short(policy, requests, layouts, times, short_ok)

        def planned(s: str, m: str, q: float | None, kind: CheckKind, alpha: float) -> PlannedCheck:
            return PlannedCheck(
                scenario=s,
                metric=m,
                q=q,
                alpha=alpha,
                beta=policy.beta,
                required=policy.requires(m, q, kind if q is None else "tail"),
                kind=kind,
            )

        latency = tuple(
            planned(s, m, q, kind, lat_alpha)
            for s in requests
            for m in policy.metrics
            for q, kind in kinds
        )
        tails = (
            tuple(planned(s, m, None, "tail", tail_alpha) for s in requests for m in policy.metrics)
            if tail_alpha > 0.0
            else ()
        )
        notes = _budget_notes(policy, latency, tails, lat_alpha, tail_alpha)
        for s, n in requests.items():
            notes.append(_detect_note(policy, s, int(n), latency + tails, layouts[s], looks[s]))
        return cls(
            policy=policy,
            requests=MappingProxyType(dict(requests)),
            limits=MappingProxyType(limits),
            latency=latency,
            tails=tails,
            error_alpha=policy.group_alpha("errors") / len(requests) if requests else 0.0,
            notes=tuple(notes),
            layouts=MappingProxyType(layouts),
            looks=MappingProxyType(looks),
        )

    def checks_for(self, scenario: str) -> tuple[PlannedCheck, ...]:
        """The scenario's quantile, window and creep checks, then its tail checks."""
        return tuple(c for c in self.latency + self.tails if c.scenario == scenario)


def _limits(
    policy: Policy,
    requests: Mapping[str, int],
    kinds: Sequence[tuple[float | None, CheckKind]],
    extendable: Collection[str] | None,
) -> dict[str, int]:
    """Each scenario's most requests per arm: its planned size, extended by policy `extend`
    where a required check may be undecided and the scenario may extend."""
    required = {
        s
        for s in requests
        for m in policy.metrics
        for q, kind in [*kinds, (None, "tail")]
        if policy.requires(m, q, "tail" if q is None and kind == "quantile" else kind)
    }
    limits = {
        s: int(n)
        + (
            math.ceil(int(n) * policy.extend)
            if s in required and (extendable is None or s in extendable)
            else 0
        )
        for s, n in requests.items()
    }
    return limits


def _refuse_short(
    policy: Policy,
    requests: Mapping[str, int],
    layouts: Mapping[str, Layout],
    times: Mapping[str, Sequence[float] | np.ndarray] | None,
    short_ok: Collection[str],
) -> None:
    """Raise ShortScenario for a scenario too short to judge, unless allowed."""
    for s, n in requests.items():
        lay = layouts[s]
        if (
            lay.planned_blocks < MIN_BLOCKS
            and policy.short_scenarios == "refuse"
            and s not in short_ok
        ):
            raise ShortScenario(
                s, int(n), lay.planned_blocks, _size_needed(int(n), times, s), MIN_BLOCKS
            )


def _budget_notes(
    policy: Policy,
    latency: Sequence[PlannedCheck],
    tails: Sequence[PlannedCheck],
    lat_alpha: float,
    tail_alpha: float,
) -> list[str]:
    """How the latency and tail budgets are spent over the planned checks."""
    notes = [
        f"Latency budget {policy.group_alpha('latency'):.4g} planned over {len(latency)} "
        f"paired checks (quantiles, window, creep): {lat_alpha:.4g} each, spent over the "
        "looks (alpha x t^2 by the share t of the limit reached); looks every "
        f"{policy.look_every} requests per engine."
    ]
    if tails:
        notes.append(
            f"Tail budget {policy.group_alpha('tail'):.4g} planned over {len(tails)} tail "
            f"checks: {tail_alpha:.4g} each."
        )
    else:
        notes.append("Tail checks off: alpha_split gives tail no budget.")
    return notes


def _size_needed(
    planned: int, times: Mapping[str, Sequence[float] | np.ndarray] | None, scenario: str
) -> int:
    """The smallest planned size that makes MIN_BLOCKS blocks, at the schedule's rate (its
    send offsets continued at their mean gap) or, without them, in requests."""
    t = None if times is None else times.get(scenario)
    gap = None
    if t is not None and len(t) >= 2:
        arr = np.asarray(t, np.float64)[:planned]
        span = float(arr[-1] - arr[0])
        gap = span / (arr.size - 1) if arr.size > 1 and span > 0 else None

    def enough(n: int) -> bool:
        layout = Layout.build(n, n, None if gap is None else np.arange(n) * gap)
        return layout.planned_blocks >= MIN_BLOCKS

    lo, hi = planned, max(planned + 1, MIN_BLOCKS)
    while not enough(hi):
        lo, hi = hi, hi * 2
    while lo + 1 < hi:  # the smallest size that is enough (block counts grow with the size)
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _look_sizes(planned: int, limit: int, policy: Policy) -> tuple[int, ...]:
    """Every `look_every` requests up to the limit, with the planned size and the limit."""
    every = max(int(policy.look_every), 1)
    sizes = set(range(every, limit + 1, every))
    sizes.update((planned, limit))
    return tuple(sorted(n for n in sizes if 0 < n <= limit))


def _detect_note(
    policy: Policy,
    scenario: str,
    n: int,
    checks: tuple[PlannedCheck, ...],
    layout: Layout,
    looks: tuple[int, ...],
) -> str:
    """What each of the scenario's checks can detect at its planned size, and what `detect`
    asks for."""
    mine = [c for c in checks if c.scenario == scenario]
    if layout.planned_blocks < MIN_BLOCKS:
        return (
            f"{scenario}: {n} planned requests per engine make {layout.describe()}; the paired "
            f"checks need {MIN_BLOCKS} to decide, so its latency will stay undecided (the "
            "policy allows short scenarios)."
        )
    parts = []
    for c in mine:
        if c.kind in ("window", "creep"):
            continue
        tol = tolerance_of(policy, c.q, c.kind)
        shift = planned_shift(layout, looks, c.q, policy.noise, c.alpha)
        detect = math.exp(math.log1p(tol) + shift) - 1.0
        parts.append(f"{c.label} {_pct(detect)}")
    text = (
        f"{scenario}: {n} planned requests per engine in {layout.describe()}; with 80% power "
        f"it can detect {', '.join(parts)} (assuming a pair's log ratio has sd "
        f"{policy.noise:g}; the checks measure it); a run of blocks above "
        f"+{policy.window_tolerance:.0%} (window) and a trend ending above "
        f"+{policy.creep_tolerance:.0%} (creep) hold too."
    )
    asks = []
    per_s = None
    if layout.block_s is not None:
        per_s = layout.block_s / max(layout.per_block(), 1.0)
    for c in mine:
        want = policy.detect_for(c.metric, c.q, c.kind if c.q is None else "tail")
        if want is None or c.kind in ("window", "creep"):
            continue
        need = size_to_detect(
            want,
            c.q,
            policy.noise,
            c.alpha,
            tolerance_of(policy, c.q, c.kind),
            per_s,
            policy.look_every,
        )
        if need is None:
            asks.append(f"{c.label} +{want:.0%} cannot be detected above its tolerance")
        else:
            verdict = "planned" if need <= n else f"raise requests to {need}"
            asks.append(f"{c.label} +{want:.0%} needs {need} per engine ({verdict})")
    if asks:
        text += " Policy detect: " + "; ".join(asks) + "."
    return text
