"""One engine's capacity bracket from its measurements: the pure rule a capacity search
(``loadgen/suite/capacity.py``) bisects by and the judge (``gate/analysis/capacity.py``)
reads back. No I/O and no import beyond the standard library, so the judge can read it without
the load generator's client."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bracket", "bracket", "monotone_votes", "passed"]


@dataclass(frozen=True, slots=True)
class Bracket:
    """Where one engine's capacity lies: in [lo, hi]. ``lo`` None: it missed at the lowest
    rate tried (capacity below it); ``hi`` None: it never missed (capacity at least ``lo``)."""

    lo: float | None
    hi: float | None

    @property
    def width(self) -> float:
        """hi / lo; infinite while either end is open."""
        if self.lo is None or self.hi is None:
            return math.inf
        return self.hi / self.lo

    @property
    def estimate(self) -> float | None:
        """The geometric middle of a closed bracket; the known end of an open one."""
        if self.lo is not None and self.hi is not None:
            return math.sqrt(self.lo * self.hi)
        return self.lo if self.lo is not None else self.hi


def passed(goodput: float, target: float) -> bool:
    """A step keeps the target when its goodput share is at least the target (inclusive, as
    vLLM's and AIPerf's SLO comparisons are)."""
    return goodput >= target - 1e-12


def monotone_votes(measured: Sequence[tuple[float, float]], target: float) -> dict[float, float]:
    """Each step's vote (1: it kept ``target``, 0: it missed) fitted as a non-increasing
    function of offered rate: the weighted least-squares fit under that order (pool adjacent
    violators, a rate weighted by its number of steps). The fit at a rate is the share of
    kept votes in its pool.

    Votes, not goodput shares: a share cannot rise more than 1 - target above the target but
    can fall 0.95 below it, so averaging shares lets one deep miss (the host paused for a
    second) outweigh a dozen passes above it. A vote weighs every step the same, however deep
    its miss or lucky its pass."""
    rates = sorted({r for r, _ in measured})
    blocks: list[tuple[float, int, list[float]]] = []  # (kept votes, steps, rates)
    for r in rates:
        votes = [1.0 if passed(g, target) else 0.0 for rr, g in measured if rr == r]
        block = (sum(votes), len(votes), [r])
        while blocks and blocks[-1][0] / blocks[-1][1] < block[0] / block[1] - 1e-12:
            kept, steps, rs = blocks.pop()
            block = (kept + block[0], steps + block[1], rs + block[2])
        blocks.append(block)
    return {r: kept / steps for kept, steps, rs in blocks for r in rs}


def bracket(measured: Sequence[tuple[float, float]], target: float) -> Bracket:
    """One engine's bracket from every (rate, goodput) it was measured at: lo is the highest
    rate where more than half of the fitted votes kept the target (:func:`monotone_votes`; a
    tie is a miss), hi the next rate measured above it. A lone miss below passes stands until
    at least two passes above outvote it; a lone pass above a miss never lifts the bracket;
    of two steps at one rate, one miss makes the rate a miss."""
    if not measured:
        return Bracket(None, None)
    fitted = monotone_votes(measured, target)
    lo: float | None = None
    for r in sorted(fitted):
        if fitted[r] <= 0.5 + 1e-12:
            return Bracket(lo, r)
        lo = r
    return Bracket(lo, None)
