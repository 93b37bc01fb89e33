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
compute. Each step carries two readings of the gate host's CPUs while it ran
(gate/telemetry/host_cpu.py): the share of the time in which some task waited for a CPU (Linux
PSI, `cpu_stall`) and the share of the CPUs that was busy (`host_cpu`). When a step that
bounds either engine's knee (a rate at its bracket's lo or hi: the steps the interval is made
of) stalled more than `policy.load.capacity_cpu_stall` (or, where the kernel gives no PSI,
was busier than `policy.load.capacity_host_cpu`), the CPUs, not the engines, may have set the
knees: engines that share the host (processes without GPUs) take CPU from each other where it
matters most, and a load generator short of CPU sends late. The check is then undecided
whatever the interval says, says so, and holds, as an unhealthy test bed does (errors.py's
`gate.environment`): the comparison the spec asked for could not be made, and a continue would
let a capacity loss through unseen (an operator who accepts that lists the check in
`policy.advisory`). On a two-core host identical CPU vLLM servers measured ratios from 0.39
to 2.0, their knee steps stalled 71-96% of the time; the sim's searches 5-10%
(docs/calibration.md). Stall is the better reading: an engine that spins its own
cores (OpenMP threads waiting for work) is busy without making anyone wait.
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
    cpu_stall: float | None = None  # share of the step's time some task waited for a CPU


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

    def knee_rates(self) -> frozenset[float]:
        """The rates at either engine's bracket's lo or hi: the steps the interval is made of."""
        return frozenset(
            r for role in ("reference", "candidate") for r in _edges(self.bracket(role))
        )

    def knee_cpu(self) -> tuple[str, float, float] | None:
        """The worst CPU reading among the steps that bound either engine's knee: ("stall",
        share, rate) when any of them has a stall reading, else ("busy", share, rate), else
        None (nothing measured)."""
        rates = self.knee_rates()
        edges = [s for s in self.steps if s.rate in rates]
        stalls = [(s.cpu_stall, s.rate) for s in edges if s.cpu_stall is not None]
        if stalls:
            return ("stall", *max(stalls))
        busy = [(s.host_cpu, s.rate) for s in edges if s.host_cpu is not None]
        return ("busy", *max(busy)) if busy else None


def _edges(b: Bracket) -> tuple[float, ...]:
    return tuple(r for r in (b.lo, b.hi) if r is not None)


def _contended(search: CapacitySearch, policy: Policy) -> str | None:
    """Why the knees may be the host's, not the engines' (module docstring), or None."""
    worst = search.knee_cpu()
    if worst is None:
        return None
    kind, share, rate = worst
    if kind == "stall":
        limit, knob = policy.load.capacity_cpu_stall, "capacity_cpu_stall"
        seen = f"tasks waited for the gate host's CPUs {share:.0%} of the time"
    else:
        limit, knob = policy.load.capacity_host_cpu, "capacity_host_cpu"
        seen = f"the gate host's CPUs were {share:.0%} busy (no CPU pressure readings)"
    if share <= limit:
        return None
    who = (
        "both engines run on it without GPUs and competed for its CPUs with each other and "
        "the load generator"
        if search.shares_host
        else "the load generator may not have sent the schedule on time, and anything else "
        "running there (an engine too) competed for them"
    )
    return (
        f" Not comparable: {seen} at {rate:.3g} req/s, a step that bounds a knee (limit "
        f"{limit:.0%}, `policy.load.{knob}`): {who}. Give each engine its own GPUs or CPUs "
        "to measure capacity."
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
    contended = _contended(search, policy)
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
    if decision == "undecided" and not search.require_decided and contended is None:
        return replace(check, required=False)
    return check


def capacity_checks(searches: Sequence[CapacitySearch], policy: Policy) -> list[Check]:
    return [capacity_check(s, policy) for s in searches]
