"""One engine's capacity bracket from its measurements: the pure rule a capacity search
(``loadgen/suite/capacity.py``) bisects by and the judge (``gate/analysis/capacity.py``)
reads back. No I/O and no import beyond the standard library, so the judge can read it without
the load generator's client."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bracket", "bracket", "monotone_goodput", "passed"]


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


def monotone_goodput(measured: Sequence[tuple[float, float]]) -> dict[float, float]:
    """Goodput as a non-increasing function of offered rate, fitted to every measurement
    (rate, goodput share): the weighted least-squares fit under that order (pool adjacent
    violators, each rate weighted by how often it was measured). A share below a higher
    rate's is averaged with it, so one unlucky step (the host paused, a burst the schedule
    drew) is weighed against its neighbours rather than deciding alone; a miss that its
    neighbours confirm stays a miss."""
    rates = sorted({r for r, _ in measured})
    blocks: list[tuple[float, int, list[float]]] = []  # (sum of shares, count, rates)
    for r in rates:
        shares = [g for rr, g in measured if rr == r]
        block = (float(sum(shares)), len(shares), [r])
        while blocks and blocks[-1][0] / blocks[-1][1] < block[0] / block[1] - 1e-12:
            total, count, rs = blocks.pop()
            block = (total + block[0], count + block[1], rs + block[2])
        blocks.append(block)
    return {r: total / count for total, count, rs in blocks for r in rs}


def bracket(measured: Sequence[tuple[float, float]], target: float) -> Bracket:
    """One engine's bracket from every (rate, goodput) it was measured at: lo is the highest
    rate at and below which the fitted goodput (:func:`monotone_goodput`) keeps the target,
    hi the next rate measured above it."""
    if not measured:
        return Bracket(None, None)
    fitted = monotone_goodput(measured)
    lo: float | None = None
    for r in sorted(fitted):
        if not passed(fitted[r], target):
            return Bracket(lo, r)
        lo = r
    return Bracket(lo, None)
