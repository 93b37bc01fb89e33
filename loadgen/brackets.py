"""One engine's capacity bracket from its measurements: the pure rule a capacity search
(``loadgen/suite/capacity.py``) bisects by and the judge (``gate/analysis/capacity.py``)
reads back. No I/O and no import beyond the standard library, so the judge can read it without
the load generator's client."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bracket", "bracket", "passed"]


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


def bracket(measured: Sequence[tuple[float, float]], target: float) -> Bracket:
    """One engine's bracket from every (rate, goodput) it was measured at (module
    docstring): lo is the highest rate at and below which every measurement passed."""
    if not measured:
        return Bracket(None, None)
    rates = sorted({r for r, _ in measured})
    ok = {r: all(passed(g, target) for rr, g in measured if rr == r) for r in rates}
    lo: float | None = None
    for r in rates:
        if not ok[r]:
            return Bracket(lo, r)
        lo = r
    return Bracket(lo, None)
