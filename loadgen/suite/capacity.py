"""The capacity entry: a paired search over offered rate for the highest rate at which each
engine keeps a goodput target, and the pure search that drives it.

What the field calls capacity. vLLM's ``bench serve --goodput ttft:MS tpot:MS`` counts a
request as good when every named SLO is at least its value, a failed request never (0.32.0,
``vllm/benchmarks/serve.py:661``, ``all([s >= r ...])``), and ``bench sweep serve_workload``
runs serve at rates spaced evenly between the serial and the batch throughput
(``vllm/benchmarks/sweep/serve_workload.py:180``); guidellm's ``sweep`` profile does the same
between its synchronous and throughput runs (``src/guidellm/benchmark/profiles/sweep.py:128``,
``np.linspace``); AIPerf's ``good_request_count`` counts requests meeting every ``--goodput``
SLO, a request without the metric being not good
(``aiperf/metrics/types/good_request_count_metric.py:76-91``). Here goodput is that count as
a share of the requests a step sent (a request that failed or never finished is not good), and
capacity is the highest offered rate whose goodput share is at least ``goodput``: what an
operator sizes a fleet by.

The search, unlike a sweep over fixed rates, brackets the knee and bisects it, each step a
paired run of one seeded schedule at one rate to both engines at the same instants. A step
sends exactly ``rate`` x ``step_s`` requests (the arrival process conditioned on its count,
:func:`loadgen.schedule.spread_offsets`): over a few seconds a Poisson count's own spread
(22% at 40/s for 2 s) would otherwise decide the step, not the engine. Every step, a repeat
included, draws the scenario's one sequence of gaps, rescaled to fill the step (the first gaps
are the same draws at every rate: common random numbers), so both knees are found on one
traffic shape. Over a step of seconds the shape's bursts weigh as much as the rate: one
identical engine kept 95% of a 250 ms SLO at 48.6/s on one shape and 81% on another
(docs/statistics.md, "Capacity"), so a knee measured on two shapes for one engine and one for
the other compares the shapes, not the engines. A repeat measures the engines and the host
again on that shape. Prompts are new at every step, so no step warms a prefix cache for a
later one.

- ramp: ``start_rate`` x ``growth``^k (the last step at ``max_rate``) until every engine has
  missed the target once, or ``max_rate`` was reached; an engine that missed already at the
  lowest rate tried is followed down by the same factor (to ``start_rate`` / ``growth``^3),
  so a candidate that collapsed below the start rate is bracketed, not left open;
- bisect: the engine whose bracket is widest (hi/lo) gets the geometric midpoint next, until
  every bracket is within ``1 + resolution``; the other engine is measured there too and its
  bracket narrows when the rate falls inside it. With the check's ``boundary`` (1 - its
  tolerance; the gate always gives it), the reference's bracket is bisected first;
- decide (with a boundary): while the check is undecided, a rate where one vote of the
  candidate decides it (:meth:`RateSearch._decisive`): a tolerance below the reference's
  knee. Its own knee is where a step's vote is least sure (goodput there sits near the
  target), while a loss well past the tolerance makes it miss there, and A/A makes it pass,
  by about a tolerance's margin. The probes come before each bisection of the candidate's
  bracket, so the two interleave until the check is decided or no probe rate is left inside
  the candidate's bracket;
- confirm: each engine's highest passing rate is measured ``repeats`` more times (the same
  gaps, new prompts); a rate whose measurements together miss lowers that engine's bracket (and
  bisection resumes if steps are left).

An engine's bracket (:func:`loadgen.brackets.bracket`) is read from every step so far, each
step one vote (kept the target or missed), through the monotone fit of the votes against rate
(:func:`loadgen.brackets.monotone_votes`: goodput cannot rise with the load offered): ``lo`` is
the highest tested rate where more than half of the fitted votes kept the target, ``hi`` the
next tested rate above it. A lone miss below passes (a pause of the host, a burst) is outvoted
by two passes above it however deep it was, a lone pass above a miss never lifts the bracket,
and of two steps at one rate one miss makes it a miss.

The step budget (:meth:`Capacity.max_steps`) is fixed by the knobs before the first step, so
the scenario's size and seconds are planned like every other scenario's; the search stops at
it rather than run on, then with brackets wider than the resolution or a lo not confirmed
(steps spent re-bracketing after a miss that later votes outweighed count against it).

A step is a transient, not a steady state: an engine offered ``x`` more than it serves builds
a queue of about ``x`` x ``step_s`` seconds of work by the step's end, so an overload below
about (the SLO's slack) / ``step_s`` goes unseen in one step. Both engines are measured the
same way, so the ratio of their knees is what the check reads; a longer ``step_s`` moves each
knee closer to the engine's sustained rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from loadgen.brackets import Bracket, bracket
from loadgen.prompts import LengthDist
from loadgen.schedule import MAX_REQUESTS, Arrival, PlannedSize, spread_offsets
from loadgen.suite.knobs import KnobError, check_knobs, replace_knobs
from loadgen.suite.workloads import DEFAULT_EXTRA, BuiltScenario, _check_requests, _requests

SLO_KEYS = ("ttft_ms", "itl_ms", "e2e_ms")
"""The objectives a capacity scenario may set: TTFT, mean ITL per request, end to end."""

Stage = Literal["ramp", "bisect", "decide", "confirm"]
RATE_DIGITS = 6
"""A probe's rate is rounded to this many decimals, as the verdict document stores rates."""
STRICT = 0.002
"""How far a boundary probe sits past the boundary, relative: a miss (or pass) there puts the
ratio strictly on one side of it, as the check's strict comparison needs."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """Search offered rate for each engine's capacity under ``slo`` and ``goodput``."""

    name: ClassVar[str] = "capacity"
    slo: Mapping[str, float] = field(default_factory=lambda: {"ttft_ms": 1000.0})
    goodput: float = 0.95
    start_rate: float = 5.0
    max_rate: float = 200.0
    growth: float = 2.0
    resolution: float = 0.03
    step_s: float = 5.0
    repeats: int = 1
    require_decided: bool = False
    arrival: Arrival = "poisson"
    prompt_tokens: int | LengthDist = 128
    max_tokens: int | LengthDist = 128
    extra: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_EXTRA))

    def __post_init__(self) -> None:
        check_knobs(self)
        if self.max_rate < self.start_rate:
            raise KnobError(
                "max_rate",
                f"must be at least start_rate ({self.start_rate:g}), got {self.max_rate:g}",
            )

    # -- the budget, by arithmetic -------------------------------------------------------------

    def ramp_rates(self) -> list[float]:
        """Every rate the ramp may offer: start x growth^k, the last one max_rate."""
        out = [self.start_rate]
        while out[-1] < self.max_rate:
            out.append(min(self.max_rate, out[-1] * self.growth))
        return out

    def bisect_steps(self) -> int:
        """Bisections that take one bracket of ratio ``growth`` to within 1 + resolution."""
        need = math.log(self.growth) / math.log1p(self.resolution)
        return max(0, math.ceil(math.log2(need))) if need > 1 else 0

    def max_steps(self) -> int:
        """The search's step budget: the whole ramp, both engines' bisections, the confirming
        repeats of both, and one more bisection each after a confirming miss. The probes at
        the check's boundary (``decide``) come out of it: each lies inside the candidate's
        bracket and narrows it, if less than a bisection would."""
        bisect = self.bisect_steps()
        return len(self.ramp_rates()) + 2 * bisect + 2 * self.repeats + 2 * (1 + self.repeats)

    def step_requests(self, rate: float) -> int:
        """A step's requests: exactly ``rate`` x ``step_s`` (rounded, at least 1), the
        schedule's count fixed so that the rate measured is the rate offered
        (:func:`loadgen.schedule.spread_offsets`)."""
        n = max(1, round(rate * self.step_s))
        if n > MAX_REQUESTS:
            raise KnobError(
                "max_rate", f"x step_s is {n} requests a step, more than {MAX_REQUESTS}"
            )
        return n

    def plan(self, **overrides: Any) -> PlannedSize:
        """The worst case: every ramp step, then every other step at the highest ramp rate
        (a bisection never offers more), ``step_s`` of load each."""
        me: Capacity = replace_knobs(self, overrides)
        ramp = me.ramp_rates()
        rest = me.max_steps() - len(ramp)
        requests = sum(me.step_requests(r) for r in ramp) + rest * me.step_requests(ramp[-1])
        _check_requests(me.step_requests(ramp[-1]), me.prompt_tokens)
        return PlannedSize(requests, me.max_steps() * me.step_s, exact=False)

    # -- one step's schedule -------------------------------------------------------------------

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        """The first step's schedule (at ``start_rate``): what a plain runner would send."""
        me: Capacity = replace_knobs(self, overrides)
        return me.step(me.start_rate, seed)

    def step(self, rate: float, seed: int, pattern: int | None = None) -> BuiltScenario:
        """One step at ``rate``: exactly :meth:`step_requests` arrivals over ``step_s`` (the
        arrival process conditioned on its count), their gaps drawn from ``pattern`` (default
        ``seed``), their prompts from ``seed``. A search gives each step its own ``seed``, so
        no prompt is sent twice and no engine's prefix cache is warmed by an earlier step
        (loadgen/prompts.py), while steps that share a ``pattern`` share their gaps."""
        gaps = seed if pattern is None else pattern
        offsets = spread_offsets(self.arrival, self.step_requests(rate), self.step_s, seed=gaps)
        reqs = _requests(len(offsets), self.prompt_tokens, self.max_tokens, self.extra, seed)
        return BuiltScenario(self.name, reqs, offsets_s=offsets)

    def search_step(self, rate: float, seed: int, index: int) -> BuiltScenario:
        """Step ``index`` of a search seeded ``seed``: new prompts (``seed + index``) on the
        search's one pattern of gaps (``seed + 500``), whatever the stage, so every step of
        the search, a confirming repeat included, has one traffic shape (module docstring)."""
        return self.step(rate, seed + index, pattern=seed + 500)

    def search(self, roles: Sequence[str], boundary: float | None = None) -> RateSearch:
        """The search over ``roles`` (with ``boundary``: the reference first, the candidate
        second, and the check's floor 1 - tolerance, which the ``decide`` probes test)."""
        return RateSearch(
            roles=tuple(roles),
            target=self.goodput,
            ramp=tuple(self.ramp_rates()),
            resolution=self.resolution,
            repeats=self.repeats,
            budget=self.max_steps(),
            boundary=boundary,
        )


# --------------------------------------------------------------------------- the pure search


@dataclass(frozen=True, slots=True)
class Step:
    """One paired step: the rate offered and each engine's goodput share there."""

    rate: float
    stage: Stage
    goodput: Mapping[str, float]


@dataclass
class RateSearch:
    """The search's state: the steps so far, and what to offer next (None: done)."""

    roles: tuple[str, ...]
    target: float
    ramp: tuple[float, ...]
    resolution: float
    repeats: int
    budget: int
    boundary: float | None = None  # the check's floor: roles are (reference, candidate)
    steps: list[Step] = field(default_factory=list)
    stopped: str = ""  # why the search ended, once it has

    def measured(self, role: str) -> list[tuple[float, float]]:
        return [(s.rate, s.goodput[role]) for s in self.steps]

    def bracket(self, role: str) -> Bracket:
        return bracket(self.measured(role), self.target)

    def record(self, rate: float, stage: Stage, goodput: Mapping[str, float]) -> None:
        missing = [r for r in self.roles if r not in goodput]
        if missing:
            raise ValueError(f"a step needs every engine's goodput; missing {missing}")
        self.steps.append(Step(rate, stage, dict(goodput)))

    def resolved(self, b: Bracket) -> bool:
        """Nothing left to bisect: closed within the resolution, or open at the ramp's end."""
        if b.lo is None:  # missed at the lowest rate tried: lower, down to the floor
            return b.hi is None or b.hi <= self.floor * (1 + 1e-9)
        if b.hi is None:
            return b.lo >= self.ramp[-1]
        return b.width <= 1.0 + self.resolution + 1e-12

    def next(self) -> tuple[float, Stage] | None:
        """The next rate and the stage it belongs to; None once the search is over (then
        ``stopped`` says why)."""
        if len(self.steps) >= self.budget:
            self.stopped = f"the step budget of {self.budget} was spent"
            return None
        brackets = [self.bracket(r) for r in self.roles]
        if any(b.hi is None for b in brackets):  # an engine that has not missed yet
            ramp = self._ramp_next()
            if ramp is not None:
                return ramp, "ramp"
        down = self._ramp_down(brackets)
        if down is not None:
            return down, "ramp"
        open_ = [b for b in brackets if not self.resolved(b)]
        if self.boundary is not None and open_ and open_[0] is brackets[0]:
            open_ = open_[:1]  # the reference's knee first: the probes are placed by it
        elif self.boundary is not None:
            probe = self._decisive(brackets[0], brackets[1], self.boundary)
            if probe is not None:
                return probe, "decide"
        if open_:
            widest = max(open_, key=lambda b: b.width)
            assert widest.lo is not None and widest.hi is not None
            return math.sqrt(widest.lo * widest.hi), "bisect"
        for b in brackets:
            if b.lo is not None and self._count(b.lo) < 1 + self.repeats:
                return b.lo, "confirm"
        below = [r for r, b in zip(self.roles, brackets, strict=True) if b.lo is None]
        if below:
            self.stopped = (
                f"{' and '.join(below)} missed the target at the search's floor of "
                f"{self.floor:.3g} req/s: capacity below the search's range"
            )
        else:
            self.stopped = "every engine's capacity was bracketed and confirmed"
        return None

    def _decisive(self, ref: Bracket, cand: Bracket, floor: float) -> float | None:
        """A rate where one vote of the candidate decides the check, while it is undecided
        (the ratio interval [lo_c / hi_r, hi_c / lo_r] straddles ``floor``): just over
        floor x hi_r (a pass puts lo_c / hi_r above the floor: pass), else just under
        floor x lo_r (a miss puts hi_c / lo_r under it: fail); only inside the candidate's
        bracket and where it was not measured yet (a vote outside it says what the bracket
        says). So the candidate is tested a tolerance away from the reference's knee, not
        at its own, where a step's vote is the least sure (docs/statistics.md, "Capacity").
        Each rate is rounded as the document stores it, so the judge reads the same side."""
        if None in (ref.lo, ref.hi, cand.lo, cand.hi):
            return None
        assert ref.lo is not None and ref.hi is not None
        assert cand.lo is not None and cand.hi is not None
        if cand.hi / ref.lo < floor or cand.lo / ref.hi >= floor:
            return None  # decided
        tried = {s.rate for s in self.steps}
        for rate in (floor * ref.hi * (1 + STRICT), floor * ref.lo * (1 - STRICT)):
            rate = round(rate, RATE_DIGITS)
            if cand.lo * (1 + 1e-9) < rate < cand.hi * (1 - 1e-9) and rate not in tried:
                return rate
        return None

    @property
    def floor(self) -> float:
        """The lowest rate the search offers: the start rate over the growth factor, cubed
        (an engine that misses the target at the start rate is followed down to it)."""
        growth = self.ramp[1] / self.ramp[0] if len(self.ramp) > 1 else 2.0
        return self.ramp[0] / growth**3

    def _ramp_down(self, brackets: list[Bracket]) -> float | None:
        """The next rate below the lowest tried, for an engine that missed at every rate it
        was offered (its capacity lies below the ramp's start), until the floor."""
        lowest = min((s.rate for s in self.steps), default=None)
        if lowest is None or not any(b.lo is None and b.hi is not None for b in brackets):
            return None
        growth = self.ramp[1] / self.ramp[0] if len(self.ramp) > 1 else 2.0
        nxt = max(self.floor, lowest / growth)
        return nxt if nxt < lowest * (1 - 1e-9) else None

    def _ramp_next(self) -> float | None:
        """The first ramp rate not yet offered, above every rate offered so far."""
        top = max((s.rate for s in self.steps), default=0.0)
        for r in self.ramp:
            if r > top:
                return r
        return None

    def _count(self, rate: float) -> int:
        return sum(1 for s in self.steps if s.rate == rate)
