"""The capacity check: the candidate's sustainable rate against the reference's, from a paired
search over offered rate (`loadgen/suite/capacity.py` runs it; docs/statistics.md, "Capacity").

Each engine's capacity lies in its bracket [lo, hi] (`loadgen.brackets.bracket`: lo is
the highest rate where the monotone fit of its steps' votes against rate keeps the target,
hi the next rate measured above it). The ratio candidate / reference then lies in

    [lo_c / hi_r, hi_c / lo_r]

(an open end is 0 or infinity). That interval is the search's resolution and its repeated
measurements near the knee, nothing more: it is not a confidence interval. Goodput at a rate
near the knee is itself noisy; the steps' fixed counts and shared traffic shape, the monotone
fit of every step's vote and the confirming repeats at each lo are what keep one step from
deciding alone, and the calibration (`gate calibrate --engines`, docs/calibration.md) shows
how often A/A continues and a 15% loss holds.

Decision, with tolerance t (`policy.load.capacity_tolerance`): fail when the whole interval
is below 1 - t (the candidate serves less, beyond the tolerance, whatever the resolution hid);
pass when the whole interval is at or above 1 - t; otherwise undecided, which holds only when
the scenario's `require_decided` is set (a warning otherwise, like an undecided latency check:
the search could not tell, at its resolution, whether the loss is within tolerance).

Compute the engines competed for. The ratio compares the engines only when each had its own
compute. Each step carries the share of the gate host's CPUs that was busy while it ran
(gate/telemetry/host_cpu.py). When a step that bounds either engine's knee (a rate at its
bracket's lo or hi: the steps the interval is made of) ran above `policy.load.capacity_host_cpu`,
the CPUs, not the engines, may have set the knees: engines that share the host (processes
without GPUs) take CPU from each other where it matters most, and a load generator short of
CPU sends late. The check is then undecided whatever the interval says, and says so (on a two
-core host identical CPU vLLM servers measured ratios down to 0.39: docs/calibration.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gate.analysis.checks import statistic_check
from gate.analysis.policy import Policy
from gate.analysis.types import Check, Decision
from loadgen.brackets import Bracket, bracket


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine at one step: requests sent, those that met every SLO, and its median
    latencies (None: nothing answered)."""

    sent: int
    good: int
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None

    @property
    def goodput(self) -> float:
        return self.good / self.sent if self.sent else 0.0


@dataclass(frozen=True, slots=True)
class CapacityStep:
    rate: float
    stage: str
    engines: Mapping[str, EngineStep]
    host_cpu: float | None = None  # share of the gate host's CPUs busy during the step


@dataclass(frozen=True, slots=True)
class CapacitySearch:
    """A capacity scenario as it ran: its target, resolution and every step; `stopped` says
    why the search ended; `require_decided`: an undecided check holds."""

    name: str
    target: float
    resolution: float
    steps: Sequence[CapacityStep]
    stopped: str = ""
    slo: str = ""
    require_decided: bool = False
    shares_host: bool = False  # both engines are processes on the gate's host without GPUs

    def bracket(self, role: str) -> Bracket:
        measured = [(s.rate, s.engines[role].goodput) for s in self.steps if role in s.engines]
        return bracket(measured, self.target)

    def knee_cpu(self) -> tuple[float, float] | None:
        """(the highest host CPU share among the steps that bound either engine's knee, the
        rate of that step), or None when none of them was measured."""
        edges = {r for role in ("reference", "candidate") for r in _edges(self.bracket(role))}
        seen = [
            (s.host_cpu, s.rate) for s in self.steps if s.rate in edges and s.host_cpu is not None
        ]
        return max(seen) if seen else None


def _edges(b: Bracket) -> tuple[float, ...]:
    return tuple(r for r in (b.lo, b.hi) if r is not None)


def _contended(search: CapacitySearch, limit: float) -> str | None:
    """Why the knees may be the host's, not the engines' (module docstring), or None."""
    worst = search.knee_cpu()
    if worst is None or worst[0] <= limit:
        return None
    who = (
        "both engines run on it without GPUs and competed for its CPUs with each other and "
        "the load generator"
        if search.shares_host
        else "the load generator may not have sent the schedule on time"
    )
    return (
        f" Not comparable: the gate host's CPUs were {worst[0]:.0%} busy at {worst[1]:.3g} "
        f"req/s, a step that bounds a knee (limit {limit:.0%}, `policy.load.capacity_host_cpu`):"
        f" {who}. Give each engine its own GPUs or CPUs to measure capacity."
    )


def ratio_interval(reference: Bracket, candidate: Bracket) -> tuple[float, float]:
    """[lo_c / hi_r, hi_c / lo_r], an open end as 0 or infinity (module docstring)."""
    low = (
        candidate.lo / reference.hi
        if candidate.lo is not None and reference.hi is not None
        else 0.0
    )
    high = (
        candidate.hi / reference.lo
        if candidate.hi is not None and reference.lo is not None
        else math.inf
    )
    if candidate.lo is not None and reference.hi is None:
        low = 0.0  # the reference's capacity is unbounded above: any ratio down to 0
    return low, high


def _words(b: Bracket) -> str:
    if b.lo is None and b.hi is None:
        return "not measured"
    if b.lo is None:
        return f"below {b.hi:.3g} req/s (it missed at the lowest rate)"
    if b.hi is None:
        return f"at least {b.lo:.3g} req/s (it never missed)"
    return f"{b.lo:.3g} to {b.hi:.3g} req/s"


def capacity_check(search: CapacitySearch, policy: Policy) -> Check:
    """The candidate's capacity against the reference's (module docstring)."""
    tol = policy.load.capacity_tolerance
    floor = 1.0 - tol
    ref, cand = search.bracket("reference"), search.bracket("candidate")
    low, high = ratio_interval(ref, cand)
    est_r, est_c = ref.estimate, cand.estimate
    ratio = est_c / est_r if est_r and est_c is not None else None
    said = (
        f"Capacity in {search.name} (goodput >= {search.target:.0%} with {search.slo}): "
        f"reference {_words(ref)}, candidate {_words(cand)}; the ratio lies in "
        f"[{low:.3f}, {high:.3g}] ({len(search.steps)} paired steps, resolution "
        f"{search.resolution:.0%}; {search.stopped or 'search ended'})."
    )
    decision: Decision
    contended = _contended(search, policy.load.capacity_host_cpu)
    if contended is not None:
        decision, why = "undecided", contended
    elif high < floor:
        decision, why = "fail", f" The candidate sustains less than {floor:.0%} of it."
    elif low >= floor:
        decision, why = "pass", f" At least {floor:.0%} of the reference's, as allowed."
    else:
        decision = "undecided"
        why = (
            f" The interval straddles {floor:.0%} (tolerance {tol:.0%}): the search cannot "
            "tell at its resolution; a finer resolution or more repeats would."
        )
    check = statistic_check(
        f"{search.name}.capacity",
        "capacity",
        "capacity",
        decision,
        said + why,
        scenario=search.name,
        reference=est_r,
        candidate=est_c,
        ratio=ratio,
        interval=(low, high) if math.isfinite(high) else None,  # JSON has no infinity
        threshold=floor,
        samples=(len(search.steps), len(search.steps)),
    )
    if decision == "undecided" and not search.require_decided:
        return replace(check, required=False)
    return check


def capacity_checks(searches: Sequence[CapacitySearch], policy: Policy) -> list[Check]:
    return [capacity_check(s, policy) for s in searches]
