"""Open-loop arrival schedules, computed up front.

The whole schedule is precomputed as offsets from the start so that the runner sleeps until an
absolute instant (``start + t_i``) instead of sleeping a gap after each send: sleep overshoot then
never accumulates, a slow response can never push later sends back (coordinated omission), and
the same seed gives the same instants on every run and for every target of a paired run.

The first request is sent at offset 0 for every arrival process, so a run never starts with an
idle random wait; gaps follow from there.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[Arrival, ...] = ("poisson", "constant", "gamma")

MAX_REQUESTS = 10_000_000
"""Refuse schedules larger than this: a typo in rate or duration should fail, not eat memory."""


@dataclass(frozen=True, slots=True)
class PlannedSize:
    """How large a schedule will be, from its parameters alone, without drawing it.

    ``requests`` is exact when ``exact`` (a count given, or constant arrivals); for Poisson or
    gamma arrivals over a duration the count is random and ``requests`` is its expectation
    rounded up (the drawn count is within a few standard deviations of it: about
    ``sqrt(requests / min(1, burstiness))``). ``duration_s`` is the span of the send times: the
    duration given, or ``(requests - 1) / rate`` for a count (the expected last send), or
    ``None`` for a closed loop, which has no schedule in time.
    """

    requests: int
    duration_s: float | None
    exact: bool


def plan_offsets(
    arrival: Arrival,
    rate: float,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
) -> PlannedSize:
    """Check the arguments of :func:`build_offsets` as it checks them (the same errors) and say
    the schedule's size, in constant time: a spec can be validated without building it."""
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival: must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    rate = _positive("rate", rate)
    _positive("burstiness", burstiness)
    if (requests is None) == (duration_s is None):
        raise ValueError("requests/duration_s: give exactly one of requests or duration_s")
    if requests is not None:
        n = _count(requests)
        return PlannedSize(n, (n - 1) / rate, exact=True)
    assert duration_s is not None
    duration_s = _positive("duration_s", duration_s)
    expected = rate * duration_s
    if expected > MAX_REQUESTS:
        raise ValueError(
            f"duration_s: rate * duration_s = {expected:.0f} requests exceeds {MAX_REQUESTS}"
        )
    if arrival == "constant":
        # build_offsets keeps i / rate < duration_s for i < ceil(expected) + 1; the quotient
        # grows with i, so a bisection over the same float divisions counts them exactly.
        n = math.ceil(expected) + 1
        kept = bisect.bisect_left(range(n), True, key=lambda i: i / rate >= duration_s)
        return PlannedSize(kept, duration_s, exact=True)
    return PlannedSize(math.ceil(expected), duration_s, exact=False)


def build_offsets(
    arrival: Arrival,
    rate: float,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> npt.NDArray[np.float64]:
    """Intended send times in seconds from the start: sorted, starting at 0, seeded.

    ``poisson`` draws exponential gaps, ``gamma`` draws gamma gaps with shape ``burstiness`` and
    the same mean ``1/rate`` (below 1 is burstier than Poisson, above 1 smoother; 1 is Poisson,
    as in vLLM bench), ``constant`` spaces requests exactly ``1/rate`` apart. Give exactly one of
    ``requests`` (that many offsets) or ``duration_s`` (every offset strictly below it).
    """
    plan_offsets(arrival, rate, requests=requests, duration_s=duration_s, burstiness=burstiness)
    rate = _positive("rate", rate)
    burstiness = _positive("burstiness", burstiness)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    if requests is not None:
        n = _count(requests)
        return _offsets(arrival, rate, burstiness, n, rng)

    assert duration_s is not None
    duration_s = _positive("duration_s", duration_s)
    expected = rate * duration_s
    if arrival == "constant":
        n = math.ceil(expected) + 1
        offsets = np.arange(n, dtype=np.float64) / rate
        return offsets[offsets < duration_s]
    # Draw in batches until the schedule passes the duration; batches come from one generator
    # in sequence, so the result depends only on the seed.
    batch = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts = [_offsets(arrival, rate, burstiness, batch, rng)]
    while parts[-1][-1] < duration_s:
        last = parts[-1][-1]
        gaps = _gaps(arrival, rate, burstiness, batch, rng)
        parts.append(last + np.cumsum(gaps))
    offsets = np.concatenate(parts)
    return offsets[offsets < duration_s]


def spread_offsets(
    arrival: Arrival,
    requests: int,
    duration_s: float,
    *,
    burstiness: float = 1.0,
    seed: int = 0,
) -> npt.NDArray[np.float64]:
    """Exactly ``requests`` send times in [0, ``duration_s``): the arrival process conditioned
    on its count. The gaps of :func:`build_offsets` (the first send at 0, then ``requests``
    more gaps, the last of them past the window's end) are scaled to the window, so a Poisson
    schedule is uniform order statistics and a gamma one keeps its burstiness.

    What a short measurement at one rate needs: over a window of a few seconds a Poisson
    count's own spread (about ``sqrt(rate * duration_s)`` requests: 22% at 40/s for 2 s) is
    larger than the differences between engines it is meant to tell apart, and both engines
    would be measured at a rate nobody offered. vLLM's ``bench serve`` fixes the count the
    same way (``--num-prompts``, gaps drawn per request: ``vllm/benchmarks/serve.py``,
    ``get_request``) and lets the duration float; here the window is fixed too.
    """
    n = _count(requests)
    duration_s = _positive("duration_s", duration_s)
    burstiness = _positive("burstiness", burstiness)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if arrival == "constant":
        return np.arange(n, dtype=np.float64) * (duration_s / n)
    rng = np.random.default_rng(seed)
    ends = np.cumsum(_gaps(arrival, 1.0, burstiness, n, rng))
    offsets = np.empty(n, dtype=np.float64)
    offsets[0] = 0.0
    offsets[1:] = ends[:-1] * (duration_s / ends[-1])
    return offsets


def _positive(name: str, value: float) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return x


def _count(requests: int) -> int:
    try:
        if isinstance(requests, bool):
            raise TypeError
        n = operator.index(requests)
    except TypeError:
        raise ValueError(f"requests: must be an integer, got {requests!r}") from None
    if n < 1:
        raise ValueError(f"requests: must be >= 1, got {n}")
    if n > MAX_REQUESTS:
        raise ValueError(f"requests: must be <= {MAX_REQUESTS}, got {n}")
    return n


def _gaps(
    arrival: Arrival, rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if arrival == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.full(n, 1.0 / rate, dtype=np.float64)


def _offsets(
    arrival: Arrival, rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    if arrival == "constant":
        # Multiply rather than cumulate so offset i is exactly i/rate, with no rounding drift.
        return np.arange(n, dtype=np.float64) / rate
    offsets = np.empty(n, dtype=np.float64)
    offsets[0] = 0.0
    np.cumsum(_gaps(arrival, rate, burstiness, n - 1, rng), out=offsets[1:])
    return offsets


# --------------------------------------------------------------------------- phased schedules


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of a phased scenario: ``duration_s`` seconds at ``rate`` requests/s, or a
    linear ramp from ``rate`` to ``end_rate``.

    A rate of 0 is allowed (an idle gap, or a ramp that starts from nothing). ``arrival`` and
    ``burstiness`` mean what they mean in :func:`build_offsets`; in a ramp the gaps are drawn
    in "expected requests" rather than seconds and mapped back through the ramp (time
    rescaling), so a Poisson ramp is an exact inhomogeneous Poisson process.
    """

    name: str
    duration_s: float
    rate: float
    end_rate: float | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: a phase needs a name")
        _positive("duration_s", self.duration_s)
        for label, value in (("rate", self.rate), ("end_rate", self.end_rate)):
            if value is None:
                continue
            if isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{label}: must be a finite number >= 0, got {value!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival: must be one of {', '.join(ARRIVALS)}")
        _positive("burstiness", self.burstiness)

    @property
    def expected_requests(self) -> float:
        end = self.rate if self.end_rate is None else self.end_rate
        return (self.rate + end) / 2 * self.duration_s


@dataclass(frozen=True, slots=True)
class PhasedSchedule:
    """Offsets for a whole phased scenario, with each request's phase.

    ``phase_index[i]`` is the index into ``phases`` of request ``i``, so results can be cut
    by phase (the overload phase, the recovery phase) after one continuous run.
    """

    phases: tuple[Phase, ...]
    offsets_s: npt.NDArray[np.float64]
    phase_index: npt.NDArray[np.int64]

    @property
    def starts_s(self) -> list[float]:
        """When each phase begins, in seconds from the start of the schedule."""
        starts = [0.0]
        for phase in self.phases[:-1]:
            starts.append(starts[-1] + phase.duration_s)
        return starts

    @property
    def duration_s(self) -> float:
        return float(sum(p.duration_s for p in self.phases))

    def phase_names(self) -> list[str]:
        """The phase name of every request, in schedule order."""
        names = [p.name for p in self.phases]
        return [names[i] for i in self.phase_index.tolist()]


def plan_phased(phases: Sequence[Phase]) -> PlannedSize:
    """Check phases as :func:`build_phased` does (the same errors) and say the schedule's size
    without drawing it: exact when every phase with arrivals is constant (a constant phase
    sends ``ceil(expected)`` requests), else the expected count rounded up."""
    if not phases:
        raise ValueError("phases: need at least one phase")
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise ValueError(f"phases: names must be unique, got {names}")
    expected = sum(p.expected_requests for p in phases)
    if expected > MAX_REQUESTS:
        raise ValueError(f"phases: {expected:.0f} expected requests exceeds {MAX_REQUESTS}")
    count = 0
    exact = True
    for k, phase in enumerate(phases):
        total = _phase_total(phase)
        if total <= 0:
            continue
        if phase.arrival == "constant":
            count += math.ceil(total)
        else:
            # A random phase: its expected arrivals, plus the one sent at 0 when it opens.
            count += math.ceil(total) + (1 if k == 0 else 0)
            exact = False
    return PlannedSize(count, float(sum(p.duration_s for p in phases)), exact=exact)


def _phase_total(phase: Phase) -> float:
    """A phase's expected requests, computed exactly as :func:`_phase_offsets` computes it."""
    r0 = phase.rate
    r1 = phase.rate if phase.end_rate is None else phase.end_rate
    return (r0 + r1) / 2 * phase.duration_s


def build_phased(phases: Sequence[Phase], *, seed: int = 0) -> PhasedSchedule:
    """Compile phases into one sorted, seeded schedule of absolute offsets.

    The first request of the first phase is sent at 0, as in :func:`build_offsets`. Later
    phases continue where the previous one ended; their first arrival follows the phase's
    own process from the phase start (a constant phase sends at its start, a Poisson one
    after a random gap). Phases are drawn from one generator in order, so the same seed and
    phases give the same schedule.
    """
    plan_phased(phases)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    parts: list[npt.NDArray[np.float64]] = []
    index: list[npt.NDArray[np.int64]] = []
    start = 0.0
    for k, phase in enumerate(phases):
        local = _phase_offsets(phase, rng, first_at_zero=k == 0)
        parts.append(start + local)
        index.append(np.full(len(local), k, dtype=np.int64))
        start += phase.duration_s
    return PhasedSchedule(
        phases=tuple(phases),
        offsets_s=np.concatenate(parts) if parts else np.zeros(0),
        phase_index=np.concatenate(index) if index else np.zeros(0, dtype=np.int64),
    )


def _phase_offsets(
    phase: Phase, rng: np.random.Generator, *, first_at_zero: bool
) -> npt.NDArray[np.float64]:
    """Offsets within one phase, in [0, duration_s)."""
    r0 = phase.rate
    r1 = phase.rate if phase.end_rate is None else phase.end_rate
    total = _phase_total(phase)  # expected requests: the phase in "Lambda" units
    if total <= 0:
        return np.zeros(0, dtype=np.float64)
    # Arrivals of a unit-rate process on [0, total), then mapped to seconds.
    if phase.arrival == "constant":
        units = np.arange(math.ceil(total) + 1, dtype=np.float64)
    else:
        batch = int(total + 6.0 * math.sqrt(total) + 16)
        first = (
            0.0 if first_at_zero else float(_gaps(phase.arrival, 1.0, phase.burstiness, 1, rng)[0])
        )
        chunks = [
            first
            + np.concatenate(
                ([0.0], np.cumsum(_gaps(phase.arrival, 1.0, phase.burstiness, batch - 1, rng)))
            )
        ]
        while chunks[-1][-1] < total:
            last = chunks[-1][-1]
            chunks.append(last + np.cumsum(_gaps(phase.arrival, 1.0, phase.burstiness, batch, rng)))
        units = np.concatenate(chunks)
    units = units[units < total]
    return _unramp(units, r0, r1, phase.duration_s)


def _unramp(
    units: npt.NDArray[np.float64], r0: float, r1: float, duration_s: float
) -> npt.NDArray[np.float64]:
    """Invert the cumulative rate ``L(t) = r0 t + (r1 - r0) t^2 / (2 D)`` at ``units``."""
    if r0 == r1:
        return units / r0
    a = (r1 - r0) / (2.0 * duration_s)
    disc = np.maximum(r0 * r0 + 4.0 * a * units, 0.0)
    # 2L / (r0 + sqrt(...)) is the stable root: no cancellation when a is small.
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(units > 0, 2.0 * units / (r0 + np.sqrt(disc)), 0.0)
    return np.minimum(np.asarray(t, dtype=np.float64), np.nextafter(duration_s, 0.0))
